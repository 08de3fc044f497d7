//! The relay into a real NATS JetStream (feature `nats`): a single server
//! killed and restarted under load, a three-node cluster losing one node and
//! then another, a relay killed and restarted, records the stream refuses,
//! records a crash left in doubt beyond the duplicate window, a record
//! published again while a cluster is still storing its first publish, a
//! subject that another stream captures, and a stream that keeps messages
//! only for its consumers.
//!
//! ```text
//! cargo test --features nats --test nats [NAME...]
//! ```
//!
//! Needs `nats-server` 2.10 or later (docs/RELAY.md says why; `.ci/run`
//! installs Debian 13's); every server
//! is started here on free 127.0.0.1 ports and killed when its test ends.
//! Its own runner (no libtest): the same binary is also the service the
//! tests kill and restart, run as `nats service ...`.

mod server;
mod service;

use std::collections::{HashMap, HashSet};
use std::process::Child;
use std::time::{Duration, Instant};

use segwal::nats::{JetStream, JetStreamOptions, StoredMessage};
use segwal::{Options, Outbox, Outcome, Publisher, Record, Relay, RelayOptions};

use server::Server;
use service::{SUBJECT, Workload};

type Test = (&'static str, fn());

const TESTS: &[Test] = &[
    (
        "poison_records_become_dead_letters_with_the_brokers_reason",
        poison,
    ),
    (
        "records_in_doubt_beyond_the_duplicate_window_are_not_stored_twice",
        in_doubt,
    ),
    (
        "single_server_killed_twice_and_relay_killed_twice",
        single_server,
    ),
    ("three_node_cluster_losing_one_node_then_another", cluster),
    (
        "a_record_published_again_while_the_cluster_stores_it_is_not_settled_by_that_answer",
        twice_at_once,
    ),
    (
        "records_whose_subject_another_stream_captures_are_retried_not_stored_there",
        other_stream,
    ),
    (
        "a_stream_keeping_messages_only_for_consumers_gets_records_once_it_has_one",
        interest,
    ),
    (
        "a_stream_deleted_while_the_relay_runs_is_created_again",
        deleted_stream,
    ),
    (
        "retries_say_that_no_server_is_connected_and_why",
        not_connected,
    ),
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("service") {
        service::main(&args[1..]);
        return;
    }
    let names: Vec<&String> = args.iter().filter(|a| !a.starts_with('-')).collect();
    let chosen: Vec<&Test> = TESTS
        .iter()
        .filter(|(name, _)| names.is_empty() || names.iter().any(|n| name.contains(n.as_str())))
        .collect();
    println!("running {} tests", chosen.len());
    let mut failed = Vec::new();
    for (name, test) in chosen {
        let started = Instant::now();
        match std::panic::catch_unwind(test) {
            Ok(()) => println!(
                "test {name} ... ok ({:.1} s)",
                started.elapsed().as_secs_f64()
            ),
            Err(_) => {
                println!("test {name} ... FAILED");
                failed.push(*name);
            }
        }
    }
    if !failed.is_empty() {
        println!("failures: {failed:?}");
        std::process::exit(1);
    }
    println!("test result: ok");
}

/// A publisher reading `stream` back (its outbox identity is irrelevant).
fn reader(servers: &str, stream: &str) -> JetStream {
    let options = JetStreamOptions::new(servers, stream, SUBJECT).timeout(Duration::from_secs(5));
    JetStream::connect_as(0, options).expect("reader connects")
}

/// The stream's message count, or `None` while it cannot be read.
fn stored(reader: &mut JetStream) -> Option<u64> {
    reader.stream_state().ok().map(|s| s.messages)
}

/// Waits until the stream holds at least `count` messages.
/// On a failure, the warnings of the `servers`' logs are printed.
fn wait_for_messages(reader: &mut JetStream, count: u64, service: &mut Child, servers: &[&Server]) {
    // The stream grows as fast as the producers' appends are fsynced, which
    // a loaded machine's disk can slow tens of times (a review measured 400
    // messages a second under a busy disk): what fails is a stream that
    // stops growing for longer than any wait the relay may have (a key held
    // for the stream's 120 s duplicate window, then a backoff and a
    // timeout), not one that grows slowly.
    const STALL_MAX: Duration = Duration::from_secs(180);
    let started = Instant::now();
    let cap = started + Duration::from_secs(900);
    let (mut most, mut grew) = (0u64, Instant::now());
    loop {
        // The last answer is kept for the failure's message: a stream that
        // stopped growing and a stream that could not be read are two
        // different failures.
        let state = reader.stream_state().map(|s| s.messages);
        if matches!(state, Ok(n) if n >= count) {
            return;
        }
        if let Ok(n) = state
            && n > most
        {
            (most, grew) = (n, Instant::now());
        }
        if let Ok(Some(status)) = service.try_wait() {
            panic!("the service exited ({status}) before the stream held {count} messages");
        }
        if grew.elapsed() >= STALL_MAX || Instant::now() >= cap {
            for server in servers {
                server.print_warnings();
            }
            panic!(
                "the stream never reached {count} messages: it held {most} after {:.0} s, \
                 {:.0} s since it last grew; its last state read: {state:?}",
                started.elapsed().as_secs_f64(),
                grew.elapsed().as_secs_f64()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads the whole stream back, and says what the stream's own state
/// counts against what was read.
/// A read that comes back with fewer messages than the stream counts (a get
/// answered "no message" while a restarted node caught up) is made again.
fn read_back(reader: &mut JetStream) -> Vec<StoredMessage> {
    let mut tries = 0;
    loop {
        let messages = reader.read_stream(1, usize::MAX).expect("read the stream");
        let state = reader.stream_state().expect("the stream's state");
        if state.messages == messages.len() as u64 {
            return messages;
        }
        let mut gaps = Vec::new();
        let mut expected = state.first;
        for m in &messages {
            if m.stream_seq != expected && gaps.len() < 10 {
                gaps.push((expected, m.stream_seq - 1));
            }
            expected = m.stream_seq + 1;
        }
        println!(
            "  the stream counts {} messages (stream seqs {} to {}), {} read; \
             stream seqs not read (first 10 ranges): {gaps:?}",
            state.messages,
            state.first,
            state.last,
            messages.len()
        );
        tries += 1;
        if tries == 5 {
            return messages;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn wait_exit(service: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if let Some(status) = service.try_wait().expect("service status") {
            assert!(status.success(), "the service failed: {status}");
            return;
        }
        assert!(Instant::now() < deadline, "the service did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Kills the service (SIGKILL) and starts it again.
fn restart_service(service: &mut Child, work: &Workload) {
    let _ = service.kill();
    let _ = service.wait();
    *service = work.spawn();
}

/// The end state every run must reach: the stream holds every record of the
/// outbox exactly once (each seq once, each appended record once), intact, in
/// order per key, with seqs in each producer's order; the outbox is empty.
fn check_delivered(work: &Workload, messages: &[StoredMessage]) {
    let total = work.producers * work.per_producer;
    let mut seqs = HashSet::new();
    let mut records = HashSet::new();
    let mut last_of_key: HashMap<String, u64> = HashMap::new();
    for m in messages {
        let seq = m.seq.expect("every message carries Segwal-Seq");
        assert!(
            seqs.insert(seq),
            "seq {seq} stored twice (stream seq {})",
            m.stream_seq
        );
        let (p, i) = service::parse(&m.payload).expect("a payload of the workload");
        assert_eq!(
            m.payload,
            service::payload(p, i),
            "payload of seq {seq} intact"
        );
        assert!(records.insert((p, i)), "record p{p} i{i} stored twice");
        let key = service::key(p, i);
        assert_eq!(
            m.subject,
            SUBJECT.replace("{key}", &key),
            "subject of seq {seq}"
        );
        if let Some(before) = last_of_key.insert(key.clone(), seq) {
            assert!(before < seq, "key {key}: seq {seq} stored after {before}");
        }
    }
    if messages.len() != total {
        let missing: Vec<(usize, usize)> = (0..work.producers)
            .flat_map(|p| (0..work.per_producer).map(move |i| (p, i)))
            .filter(|r| !records.contains(r))
            .take(10)
            .collect();
        println!("  records missing from the stream (first 10, producer and index): {missing:?}");
    }
    assert_eq!(messages.len(), total, "every record stored once");
    // Seqs number frames, not only records (acks and fields frames take
    // theirs), so a record's seq is not its rank: what holds is that each
    // producer's records, appended one after another, have rising seqs.
    let mut of_record: HashMap<(usize, usize), u64> = HashMap::new();
    for m in messages {
        let (p, i) = service::parse(&m.payload).expect("parsed above");
        of_record.insert((p, i), m.seq.expect("checked above"));
    }
    for p in 0..work.producers {
        for i in 1..work.per_producer {
            let (before, after) = (of_record[&(p, i - 1)], of_record[&(p, i)]);
            assert!(
                before < after,
                "producer {p}: record {i} has seq {after}, record {} {before}",
                i - 1
            );
        }
    }
    let outbox = work.open();
    let stats = outbox.stats();
    assert_eq!(
        (
            stats.pending,
            stats.claimed,
            stats.delayed,
            stats.dead_letters
        ),
        (0, 0, 0, 0)
    );
    outbox.close().expect("close");
}

fn single_server() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut server = Server::single(tmp.path());
    server.start();
    let work = Workload {
        dir: tmp.path().join("service"),
        servers: server.url(),
        stream: "SINGLE".into(),
        replicas: 1,
        producers: 8,
        per_producer: 25_000,
    };
    std::fs::create_dir_all(&work.dir).expect("service dir");
    let started = Instant::now();
    let mut service = work.spawn();
    let mut reader = reader(&work.servers, &work.stream);
    for (at, what) in [
        (30_000, "server"),
        (70_000, "relay"),
        (110_000, "server"),
        (150_000, "relay"),
    ] {
        wait_for_messages(&mut reader, at, &mut service, &[&server]);
        if what == "server" {
            server.kill();
            std::thread::sleep(Duration::from_millis(500));
            server.start();
        } else {
            restart_service(&mut service, &work);
        }
        println!(
            "  killed the {what} at {at} messages stored ({:.1} s)",
            started.elapsed().as_secs_f64()
        );
    }
    wait_exit(&mut service);
    println!(
        "  the service finished ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    let messages = read_back(&mut reader);
    println!(
        "  read the stream back ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    check_delivered(&work, &messages);
}

fn cluster() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut nodes = Server::start_cluster(tmp.path(), Duration::from_secs(60));
    let servers: Vec<String> = nodes.iter().map(Server::url).collect();
    let work = Workload {
        dir: tmp.path().join("service"),
        servers: servers.join(","),
        stream: "CLUSTER".into(),
        replicas: 3,
        producers: 8,
        per_producer: 25_000,
    };
    std::fs::create_dir_all(&work.dir).expect("service dir");
    let started = Instant::now();
    let mut service = work.spawn();
    let mut reader = reader(&work.servers, &work.stream);
    for (at, node) in [(40_000, 0), (120_000, 1)] {
        wait_for_messages(
            &mut reader,
            at,
            &mut service,
            &nodes.iter().collect::<Vec<_>>(),
        );
        nodes[node].kill();
        let name = &nodes[node].name;
        println!(
            "  killed node {name} at {at} messages stored ({:.1} s)",
            started.elapsed().as_secs_f64()
        );
        std::thread::sleep(Duration::from_secs(2));
        nodes[node].restart(Duration::from_secs(60));
        println!(
            "  node {} back ({:.1} s)",
            nodes[node].name,
            started.elapsed().as_secs_f64()
        );
    }
    wait_exit(&mut service);
    println!(
        "  the service finished ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    let messages = read_back(&mut reader);
    if messages.len() != work.producers * work.per_producer {
        for node in &nodes {
            node.print_warnings();
        }
    }
    check_delivered(&work, &messages);
}

fn poison() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut server = Server::single(tmp.path());
    server.start();
    let outbox = Outbox::open(tmp.path().join("outbox"), Options::default()).expect("open");
    let mut big = HashSet::new();
    for i in 0..1_000usize {
        let size = if i % 97 == 0 { 4096 } else { 200 };
        let seq = outbox
            .append(&vec![b'a' + (i % 26) as u8; size])
            .expect("append");
        if size > 1024 {
            big.insert(seq);
        }
    }
    let options = JetStreamOptions::new(&server.url(), "POISON", SUBJECT)
        .create_stream(1)
        .stream_max_message_size(1024)
        // Smaller than the relay's batch (256): published in chunks.
        .in_flight(64);
    let publisher = JetStream::connect(&outbox, options).expect("publisher");
    let mut relay = Relay::new(outbox.clone(), publisher, RelayOptions::default());
    while outbox.stats().pending > 0 {
        relay.step().expect("a round");
    }
    let stats = relay.stats();
    assert_eq!(stats.dead_letters, big.len() as u64);
    assert_eq!(stats.published, 1_000 - big.len() as u64);
    let dead = outbox.dead_letters(usize::MAX).expect("dead letters");
    assert_eq!(dead.iter().map(|d| d.seq()).collect::<HashSet<_>>(), big);
    for letter in &dead {
        assert!(
            letter.reason().contains("maximum"),
            "the broker's reason is kept: {:?}",
            letter.reason()
        );
    }
    let mut reader = reader(&server.url(), "POISON");
    let messages = reader.read_stream(1, usize::MAX).expect("read");
    assert_eq!(messages.len(), 1_000 - big.len());
    assert!(messages.iter().all(|m| m.payload.len() == 200));
    outbox.close().expect("close");
}

/// Publishes 100 records without acknowledging them (a relay that crashed
/// after the broker stored them), waits out the stream's duplicate window,
/// and relays them again: reconciliation finds them in the stream, so the
/// stream holds each once; with reconciliation off it holds each twice (the
/// check above is not vacuous).
fn in_doubt() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut server = Server::single(tmp.path());
    server.start();
    for (depth, stream, expected) in [(10_000, "DOUBT", 100), (0, "DOUBT_UNCHECKED", 200)] {
        let dir = tmp.path().join(stream);
        let options = || {
            JetStreamOptions::new(&server.url(), stream, &format!("{stream}.records"))
                .create_stream(1)
                .stream_duplicate_window(Duration::from_secs(1))
                .reconcile_depth(depth)
        };
        {
            let outbox = Outbox::open(&dir, Options::default()).expect("open");
            for i in 0..100u32 {
                outbox.append(&i.to_le_bytes()).expect("append");
            }
            let mut publisher = JetStream::connect(&outbox, options()).expect("publisher");
            let records = outbox.claim(100).expect("claim");
            let outcomes = publisher.publish(&records);
            assert!(
                outcomes.iter().all(|o| *o == Outcome::Stored),
                "{outcomes:?}"
            );
            // The process dies here: nothing acknowledged.
            outbox.close().expect("close");
        }
        std::thread::sleep(Duration::from_millis(2_500));
        let outbox = Outbox::open(&dir, Options::default()).expect("reopen");
        assert_eq!(outbox.stats().pending, 100);
        let publisher = JetStream::connect(&outbox, options()).expect("publisher");
        let mut relay = Relay::new(outbox.clone(), publisher, RelayOptions::default());
        while outbox.stats().pending > 0 {
            relay.step().expect("a round");
        }
        let mut reader = JetStream::connect(&outbox, options()).expect("reader");
        let messages = reader.read_stream(1, usize::MAX).expect("read");
        assert_eq!(messages.len(), expected, "stream {stream}");
        if depth > 0 {
            assert_eq!(relay.stats().duplicates, 100);
            assert_eq!(relay.stats().published, 0);
        }
        outbox.close().expect("close");
    }
}

/// Each of 1,000 records published twice back to back, pipelined, to an R3
/// stream: the second copy reaches the stream's leader while the first is
/// proposed but not yet stored. nats-server 2.10 answers it as a duplicate at
/// sequence 0 (from 2.11, with an error): no proof that anything holds the
/// record, since the first proposal can still be lost, so the publisher
/// returns `Retry` for it, never `Duplicate` (docs/RELAY.md, "A duplicate
/// that is not one"). The stream holds each record once, and every record
/// settled by either answer.
fn twice_at_once() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let nodes = Server::start_cluster(tmp.path(), Duration::from_secs(60));
    let servers: Vec<String> = nodes.iter().map(Server::url).collect();
    let servers = servers.join(",");
    let outbox = outbox_of(&tmp.path().join("outbox"), 1_000);
    let options = JetStreamOptions::new(&servers, "TWICE", "twice.records")
        .create_stream(3)
        .timeout(Duration::from_secs(10));
    let mut publisher = JetStream::connect(&outbox, options).expect("publisher");
    let records = outbox.claim(1_000).expect("claim");
    assert_eq!(records.len(), 1_000);
    let doubled: Vec<Record> = records
        .iter()
        .flat_map(|r| [r.clone(), r.clone()])
        .collect();
    let outcomes = publisher.publish(&doubled);
    let mut reader = reader(&servers, "TWICE");
    let messages = read_back(&mut reader);
    let mut in_stream = HashSet::new();
    for m in &messages {
        let seq = m.seq.expect("every message carries Segwal-Seq");
        assert!(in_stream.insert(seq), "seq {seq} stored twice");
    }
    let settles = |o: &Outcome| matches!(o, Outcome::Stored | Outcome::Duplicate);
    let mut answered_in_flight = 0;
    let mut first_reasons = HashMap::new();
    for (record, pair) in records.iter().zip(outcomes.chunks(2)) {
        let seq = record.seq().get();
        if pair.iter().any(settles) {
            assert!(
                in_stream.contains(&seq),
                "seq {seq} settled ({pair:?}) but not in the stream"
            );
        }
        assert_ne!(
            (&pair[0], &pair[1]),
            (&Outcome::Stored, &Outcome::Stored),
            "seq {seq} stored twice"
        );
        if pair[0] == Outcome::Stored
            && let Outcome::Retry(reason) = &pair[1]
        {
            answered_in_flight += 1;
            *first_reasons.entry(reason.clone()).or_insert(0) += 1;
        }
    }
    println!(
        "  of 1,000 second copies sent while the first was being stored, {answered_in_flight} \
         were answered before it was: {first_reasons:?}"
    );
    // Sent right behind the first, at least one second copy reaches the
    // leader before a follower has stored the first; were such an answer
    // taken for a duplicate, none would be `Retry`.
    assert!(
        answered_in_flight > 0,
        "no second copy was answered while its first was in flight: {:?}",
        &outcomes[..8]
    );
    outbox.close().expect("close");
}

/// An outbox in `dir` holding `count` records (their index, 4 bytes), none
/// keyed.
fn outbox_of(dir: &std::path::Path, count: u32) -> Outbox {
    let outbox = Outbox::open(dir, Options::default()).expect("open");
    for i in 0..count {
        outbox.append(&i.to_le_bytes()).expect("append");
    }
    outbox
}

/// Every outcome a `Retry` whose reason says `why`.
fn assert_retried(outcomes: &[Outcome], why: &str) {
    for outcome in outcomes {
        assert!(
            matches!(outcome, Outcome::Retry(reason) if reason.contains(why)),
            "not every outcome a Retry for {why:?}: {outcomes:?}"
        );
    }
}

/// A publisher told stream `MINE` with a subject that stream `THEIRS`
/// captures: the server would store the records in `THEIRS` and answer a
/// `PubAck` from it. Every message names its expected stream, so the server
/// refuses them instead (JetStream error 10060): each is `Retry`, `THEIRS`
/// holds none, and the outbox keeps them all.
fn other_stream() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut server = Server::single(tmp.path());
    server.start();
    let url = server.url();
    for (stream, subject) in [("MINE", "mine.{key}"), ("THEIRS", "theirs.{key}")] {
        let options = JetStreamOptions::new(&url, stream, subject).create_stream(1);
        let mut maker = JetStream::connect_as(0, options).expect("connects");
        assert_eq!(maker.stream_state().expect("created").messages, 0);
    }
    let outbox = outbox_of(&tmp.path().join("outbox"), 10);
    let options = JetStreamOptions::new(&url, "MINE", "theirs.{key}");
    let mut publisher = JetStream::connect(&outbox, options).expect("publisher");
    let records = outbox.claim(10).expect("claim");
    assert_retried(&publisher.publish(&records), "expected stream");
    for stream in ["MINE", "THEIRS"] {
        let mut reader = reader(&url, stream);
        assert_eq!(stored(&mut reader), Some(0), "stream {stream}");
    }
    outbox.close().expect("close");
}

/// A stream with `interest` retention acknowledges a publish with a sequence
/// and keeps nothing when no consumer's filter matches its subject. The
/// publisher reads the stream's retention and, for such a stream, its
/// consumers before each batch: with none, and then with one filtered to
/// another subject, every record is `Retry` (and the stream holds nothing);
/// once a consumer's filter matches the records' subject, they are stored.
fn interest() {
    use async_nats::jetstream::{self, consumer, stream};

    let tmp = tempfile::tempdir().expect("tempdir");
    let mut server = Server::single(tmp.path());
    server.start();
    let url = server.url();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (_context, made) = runtime.block_on(async {
        let client = async_nats::connect(url.as_str()).await.expect("connects");
        let context = jetstream::new(client);
        let config = stream::Config {
            name: "INTEREST".into(),
            subjects: vec!["interest.*".into()],
            retention: stream::RetentionPolicy::Interest,
            ..Default::default()
        };
        let made = context.create_stream(config).await.expect("stream");
        (context, made)
    });
    let consumer_on = |name: &str, filter: &str| {
        runtime.block_on(async {
            let config = consumer::pull::Config {
                durable_name: Some(name.into()),
                filter_subject: filter.into(),
                ..Default::default()
            };
            made.create_consumer(config).await.expect("consumer");
        })
    };
    let outbox = outbox_of(&tmp.path().join("outbox"), 10);
    // The records have no key: their subject is `interest._`.
    let options = JetStreamOptions::new(&url, "INTEREST", "interest.{key}");
    let mut publisher = JetStream::connect(&outbox, options).expect("publisher");
    let records = outbox.claim(10).expect("claim");
    let mut reader = reader(&url, "INTEREST");
    for (consumer, filter, refusal) in [
        (None, "", "and has none"),
        (
            Some("elsewhere"),
            "interest.other",
            "is interested in interest._",
        ),
    ] {
        if let Some(name) = consumer {
            consumer_on(name, filter);
        }
        assert_retried(&publisher.publish(&records), refusal);
        assert_eq!(stored(&mut reader), Some(0));
    }
    consumer_on("here", "interest._");
    let outcomes = publisher.publish(&records);
    assert!(
        outcomes.iter().all(|o| *o == Outcome::Stored),
        "{outcomes:?}"
    );
    assert_eq!(stored(&mut reader), Some(10));
    outbox.close().expect("close");
}

/// A stream deleted while the publisher runs: the records published then
/// are `Retry`, and with `create_stream` the publisher creates it again and
/// stores them; none is acknowledged that the new stream does not hold.
fn deleted_stream() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut server = Server::single(tmp.path());
    server.start();
    let url = server.url();
    let outbox = outbox_of(&tmp.path().join("outbox"), 10);
    let options = JetStreamOptions::new(&url, "GONE", "gone.{key}").create_stream(1);
    let mut publisher = JetStream::connect(&outbox, options).expect("publisher");
    let first = outbox.claim(5).expect("claim");
    assert!(
        publisher
            .publish(&first)
            .iter()
            .all(|o| matches!(o, Outcome::Stored))
    );
    for r in &first {
        outbox.ack(r.seq()).expect("ack");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let client = async_nats::connect(url.as_str()).await.expect("connects");
        async_nats::jetstream::new(client)
            .delete_stream("GONE")
            .await
            .expect("delete the stream");
    });
    // The publisher reads the stream's configuration at most once a second.
    std::thread::sleep(Duration::from_millis(1100));
    let rest = outbox.claim(5).expect("claim");
    let mut stored = HashSet::new();
    let mut retried = Vec::new();
    for _ in 0..20 {
        let pending: Vec<Record> = rest
            .iter()
            .filter(|r| !stored.contains(&r.seq()))
            .cloned()
            .collect();
        if pending.is_empty() {
            break;
        }
        for (r, outcome) in pending.iter().zip(publisher.publish(&pending)) {
            match outcome {
                Outcome::Stored => {
                    stored.insert(r.seq());
                }
                Outcome::Retry(reason) => retried.push(reason),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    assert_eq!(stored.len(), 5, "retries: {retried:?}");
    assert!(
        retried.iter().any(|r| r.contains("not found")),
        "the deletion was not seen: {retried:?}"
    );
    let mut reader = reader(&url, "GONE");
    let messages = read_back(&mut reader);
    let seqs: HashSet<u64> = messages.iter().filter_map(|m| m.seq).collect();
    let expected: HashSet<u64> = rest.iter().map(|r| r.seq().get()).collect();
    assert_eq!(
        seqs, expected,
        "the new stream holds the records published after"
    );
    outbox.close().expect("close");
}

/// With no server to connect to, every `Retry` says that the client is not
/// connected and what its last attempt met, rather than only "timed out".
fn not_connected() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let tmp = tempfile::tempdir().expect("tempdir");
    let outbox = outbox_of(&tmp.path().join("outbox"), 3);
    let url = format!("nats://127.0.0.1:{port}");
    let options =
        JetStreamOptions::new(&url, "NONE", "none.{key}").timeout(Duration::from_millis(300));
    let mut publisher = JetStream::connect(&outbox, options).expect("connects in the background");
    let records = outbox.claim(3).expect("claim");
    assert_retried(&publisher.publish(&records), "not connected to any server");
    outbox.close().expect("close");
}
