//! The relay runner against fake brokers: failures, timeouts after storing,
//! duplicates, refusals, slow publishes, restarts. Nothing is lost, nothing
//! is acknowledged that the broker does not hold, per-key order holds.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use parking_lot::Mutex;
use segwal::sim::Rng;
use segwal::{Message, Options, Outbox, Outcome, Publisher, Record, Relay, RelayOptions, Seq};

use crate::tmp;

/// What a fake broker stored, in order: (seq, key, payload).
type Stored = Arc<Mutex<Vec<(Seq, Option<Vec<u8>>, Vec<u8>)>>>;

/// A broker that deduplicates by the outbox's seq (as NATS JetStream does by
/// `Nats-Msg-Id`), and misbehaves at random.
struct FlakyBroker {
    rng: Rng,
    stored: Stored,
}

impl FlakyBroker {
    fn new(seed: u64, stored: &Stored) -> FlakyBroker {
        FlakyBroker {
            rng: Rng::new(seed),
            stored: stored.clone(),
        }
    }
}

impl Publisher for FlakyBroker {
    fn publish(&mut self, records: &[Record]) -> Vec<Outcome> {
        let mut stored = self.stored.lock();
        let mut out = Vec::new();
        for r in records {
            let held = stored.iter().any(|(s, _, _)| *s == r.seq());
            let draw = self.rng.below(100);
            out.push(if held {
                Outcome::Duplicate
            } else if draw < 15 {
                Outcome::Retry("broker unavailable".into())
            } else if draw < 25 {
                // Stored, but the answer was lost: a timeout.
                stored.push((r.seq(), r.key().map(<[u8]>::to_vec), r.payload().to_vec()));
                Outcome::Retry("publish timed out".into())
            } else {
                stored.push((r.seq(), r.key().map(<[u8]>::to_vec), r.payload().to_vec()));
                Outcome::Stored
            });
        }
        // Sometimes the answers for the tail of a batch never come.
        if self.rng.chance(10) {
            out.truncate(out.len() / 2);
        }
        out
    }
}

fn fast() -> RelayOptions {
    RelayOptions::default()
        .batch(32)
        .wait(Duration::from_millis(5))
        .backoff(Duration::from_millis(1), Duration::from_millis(8))
}

#[test]
fn a_flaky_broker_ends_up_with_every_record_once_in_order_per_key() {
    for seed in 1..=12u64 {
        let (_t, dir) = tmp();
        let open = || Outbox::open(&dir, Options::default().lease(Duration::from_secs(3600)));
        let outbox = open().expect("open");
        let mut appended: BTreeMap<Seq, (Option<Vec<u8>>, Vec<u8>)> = BTreeMap::new();
        let mut rng = Rng::new(seed);
        let stored = Arc::new(Mutex::new(Vec::new()));
        let mut outbox = outbox;
        for round in 0..4 {
            for i in 0..150 {
                let payload = format!("seed {seed} round {round} record {i}").into_bytes();
                let key = rng
                    .chance(70)
                    .then(|| format!("k{}", rng.below(5)).into_bytes());
                let mut m = Message::new(&payload);
                if let Some(k) = &key {
                    m = m.key(k);
                }
                let a = outbox.append_message(&m).expect("append");
                appended.insert(a.seq, (key, payload.clone()));
            }
            let broker = FlakyBroker::new(seed * 100 + round, &stored);
            let mut relay = Relay::new(outbox.clone(), broker, fast());
            // Part of the backlog, then a restart of the relay and the outbox
            // with records still out (released by the close).
            for _ in 0..(5 + rng.below(10)) {
                relay.step().expect("step");
            }
            drop(relay);
            outbox.close().expect("close");
            outbox = open().expect("reopen");
        }
        let broker = FlakyBroker::new(seed * 1000, &stored);
        let mut relay = Relay::new(outbox.clone(), broker, fast());
        let mut idle = 0;
        while idle < 200 {
            if relay.step().expect("step") == 0 {
                idle += 1;
            } else {
                idle = 0;
            }
            let s = outbox.stats();
            if s.pending + s.claimed + s.delayed + s.held_by_key == 0 {
                break;
            }
        }
        let stats = relay.stats();
        drop(relay);
        let s = outbox.stats();
        assert_eq!(
            (s.pending, s.claimed, s.delayed, s.held_by_key),
            (0, 0, 0, 0),
            "seed {seed}: the outbox is drained"
        );
        assert!(
            stats.retries > 0 && stats.duplicates > 0,
            "seed {seed}: {stats:?}"
        );
        let stored = stored.lock();
        // Once each, intact.
        let seqs: BTreeSet<Seq> = stored.iter().map(|(s, _, _)| *s).collect();
        assert_eq!(
            seqs.len(),
            stored.len(),
            "seed {seed}: a record stored twice"
        );
        assert_eq!(
            seqs,
            appended.keys().copied().collect(),
            "seed {seed}: records lost"
        );
        for (seq, key, payload) in stored.iter() {
            assert_eq!(
                &appended[seq],
                &(key.clone(), payload.clone()),
                "seed {seed}"
            );
        }
        // In order per key.
        let mut last: BTreeMap<Vec<u8>, Seq> = BTreeMap::new();
        for (seq, key, _) in stored.iter() {
            if let Some(k) = key
                && let Some(prev) = last.insert(k.clone(), *seq)
            {
                assert!(
                    prev < *seq,
                    "seed {seed}: key {k:?}: {seq} stored after {prev}"
                );
            }
        }
        outbox.close().expect("close");
    }
}

#[test]
fn refused_records_become_dead_letters_with_the_brokers_reason() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let big = outbox.append(&[0u8; 2000]).expect("append");
    for i in 0..10u8 {
        outbox.append(&[i; 10]).expect("append");
    }
    let stored = Arc::new(Mutex::new(0u32));
    let count = stored.clone();
    let publish = move |records: &[Record]| {
        records
            .iter()
            .map(|r| {
                if r.payload().len() > 1024 {
                    Outcome::Refused("maximum message payload exceeded".into())
                } else {
                    *count.lock() += 1;
                    Outcome::Stored
                }
            })
            .collect()
    };
    let mut relay = Relay::new(outbox.clone(), publish, fast());
    while relay.step().expect("step") > 0 {}
    let stats = relay.stats();
    assert_eq!((stats.published, stats.dead_letters), (10, 1));
    let dead = outbox.dead_letters(10).expect("dead_letters");
    assert_eq!(dead.len(), 1);
    assert_eq!(
        (dead[0].seq(), dead[0].reason()),
        (big, "maximum message payload exceeded")
    );
    assert_eq!(*stored.lock(), 10);
    drop(relay);
    outbox.close().expect("close");
}

#[test]
fn outcomes_missing_from_a_publish_are_retries_and_extra_ones_are_ignored() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    for i in 0..4u8 {
        outbox.append(&[i; 8]).expect("append");
    }
    // The first publish answers for its first record only; the later ones
    // answer with twice as many outcomes as records, all stored, and note
    // what each record carries.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let notes = seen.clone();
    let mut rounds = 0;
    let publish = move |records: &[Record]| {
        rounds += 1;
        if rounds == 1 {
            return vec![Outcome::Stored];
        }
        notes.lock().extend(records.iter().map(|r| {
            (
                r.payload()[0],
                r.attempt(),
                r.last_error().map(str::to_owned),
            )
        }));
        vec![Outcome::Stored; 2 * records.len()]
    };
    let mut relay = Relay::new(outbox.clone(), publish, fast());
    assert_eq!(relay.step().expect("a round with one outcome"), 4);
    let stats = relay.stats();
    assert_eq!((stats.published, stats.retries), (1, 3));
    let mut rounds = 0;
    while relay.stats().published < 4 {
        relay.step().expect("a round with extra outcomes");
        rounds += 1;
        assert!(rounds < 10_000, "the three records never came back");
    }
    assert_eq!(relay.stats().published, 4);
    let mut seen = seen.lock().clone();
    seen.sort();
    let reason = Some("the publisher gave no outcome".to_owned());
    assert_eq!(
        seen,
        vec![
            (1, 2, reason.clone()),
            (2, 2, reason.clone()),
            (3, 2, reason)
        ]
    );
    drop(relay);
    outbox.close().expect("close");
}

#[test]
fn a_slow_publish_keeps_its_records_by_renewing_their_leases() {
    let (_t, dir) = tmp();
    // A lease ten renewals long: the renewing thread may be kept off the
    // processor for most of a second on a loaded machine without the lease
    // running out.
    let outbox =
        Outbox::open(&dir, Options::default().lease(Duration::from_secs(1))).expect("open");
    let seq = outbox.append(b"slow").expect("append");
    let other = outbox.clone();
    let stolen = Arc::new(Mutex::new(Vec::new()));
    let seen = stolen.clone();
    let publish = move |records: &[Record]| {
        // Three leases long; another relay claims all the while.
        for _ in 0..15 {
            std::thread::sleep(Duration::from_millis(200));
            seen.lock()
                .extend(other.claim(10).expect("claim").iter().map(|r| r.seq()));
        }
        records.iter().map(|_| Outcome::Stored).collect()
    };
    let options = fast().renew_leases(Duration::from_millis(100), Duration::from_secs(1));
    let mut relay = Relay::new(outbox.clone(), publish, options);
    assert_eq!(relay.step().expect("step"), 1);
    assert!(
        stolen.lock().is_empty(),
        "claimed again while published: {stolen:?}"
    );
    assert_eq!(outbox.stats().claimed_expired, 0);
    assert_eq!(relay.stats().published, 1);
    assert!(
        outbox.claim(10).expect("claim").is_empty(),
        "{seq} acknowledged"
    );
    drop(relay);
    outbox.close().expect("close");
}

/// A publisher that panics, caught by the service around `step`: the relay
/// stops renewing that batch's leases, so its records come back when the
/// leases run out and are published by a later round (before, the relay
/// renewed them for as long as it lived, and they were never delivered).
#[test]
fn a_batch_whose_publish_panicked_comes_back_when_its_leases_run_out() {
    let (_t, dir) = tmp();
    let outbox =
        Outbox::open(&dir, Options::default().lease(Duration::from_secs(1))).expect("open");
    let seq = outbox.append(b"panics once").expect("append");
    let mut calls = 0;
    let publish = move |records: &[Record]| {
        calls += 1;
        assert!(calls > 1, "the broker client panicked");
        records.iter().map(|_| Outcome::Stored).collect()
    };
    // Renewals ten to a lease, as a relay would make them.
    let options = fast().renew_leases(Duration::from_millis(100), Duration::from_secs(1));
    let mut relay = Relay::new(outbox.clone(), publish, options);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| relay.step()));
    assert!(panicked.is_err());
    let started = std::time::Instant::now();
    while relay.stats().published == 0 && started.elapsed() < Duration::from_secs(15) {
        relay.step().expect("step");
    }
    assert_eq!(relay.stats().published, 1, "{seq} never came back");
    assert_eq!(outbox.stats().claimed, 0);
    drop(relay);
    outbox.close().expect("close");
}

/// The outcome a publish that outlasted its lease gives: `Refused` or
/// `Retry`.
fn late_outcome(refuse: bool) -> Outcome {
    if refuse {
        Outcome::Refused("too large".into())
    } else {
        Outcome::Retry("timed out".into())
    }
}

/// A publish that outlasts its lease (renewals too far apart) and then
/// says `Retry` or `Refused`: the record went back to pending meanwhile, so
/// it is settled by its next delivery; the round is not an error (before,
/// `step` and `run` failed with `NotClaimed`).
#[test]
fn a_publish_that_outlasts_its_lease_settles_its_record_at_the_next_delivery() {
    for refuse in [false, true] {
        let (_t, dir) = tmp();
        let outbox =
            Outbox::open(&dir, Options::default().lease(Duration::from_millis(200))).expect("open");
        outbox.append(b"slow").expect("append");
        let other = outbox.clone();
        let mut calls = 0;
        let publish = move |records: &[Record]| {
            calls += 1;
            if calls == 1 {
                // Until the outbox has seen the lease run out.
                while other.stats().claimed_expired == 0 {
                    std::thread::sleep(Duration::from_millis(20));
                }
                return records.iter().map(|_| late_outcome(refuse)).collect();
            }
            records.iter().map(|_| Outcome::Stored).collect()
        };
        let options = fast().renew_leases(Duration::from_secs(3600), Duration::from_secs(3600));
        let mut relay = Relay::new(outbox.clone(), publish, options);
        assert_eq!(relay.step().expect("a round whose lease ran out"), 1);
        let stats = relay.stats();
        assert_eq!((stats.retries, stats.dead_letters), (0, 0), "{stats:?}");
        // Delivered again, as a later attempt, and stored.
        while relay.stats().published == 0 {
            relay.step().expect("step");
        }
        assert_eq!(outbox.stats().dead_letters, 0);
        drop(relay);
        outbox.close().expect("close");
    }
}

/// Two relays on one outbox: a publish outlasts its lease, another relay
/// claims the record meanwhile, and the first publish's `Retry` or
/// `Refused` comes too late. It settles nothing: the other relay's claim
/// still holds the record (not released to a third, not parked while it is
/// being published).
#[test]
fn a_late_outcome_leaves_another_relays_claim_alone() {
    for refuse in [false, true] {
        let (_t, dir) = tmp();
        let outbox =
            Outbox::open(&dir, Options::default().lease(Duration::from_millis(200))).expect("open");
        let seq = outbox.append(b"slow").expect("append");
        let other = outbox.clone();
        let taken = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let taken_by_other = taken.clone();
        let publish = move |records: &[Record]| {
            while other.stats().claimed_expired == 0 {
                std::thread::sleep(Duration::from_millis(20));
            }
            // The other relay's claim: the same record, a later delivery.
            let again = other.claim(1).expect("claim");
            assert_eq!(again.len(), 1);
            assert_eq!((again[0].seq(), again[0].attempt()), (seq, 2));
            taken_by_other.lock().extend(again);
            records.iter().map(|_| late_outcome(refuse)).collect()
        };
        let options = fast().renew_leases(Duration::from_secs(3600), Duration::from_secs(3600));
        let mut relay = Relay::new(outbox.clone(), publish, options);
        assert_eq!(relay.step().expect("a round whose lease ran out"), 1);
        let stats = relay.stats();
        assert_eq!((stats.retries, stats.dead_letters), (0, 0), "{stats:?}");
        let held = outbox.stats();
        assert_eq!((held.claimed, held.dead_letters), (1, 0), "{held:?}");
        assert!(
            outbox.claim(1).expect("claim").is_empty(),
            "the record went back to pending under the other relay's claim"
        );
        // The other relay settles its own delivery.
        let mine = taken.lock().pop().expect("the other relay's record");
        outbox
            .dead_letter_record(&mine, "the other relay's outcome")
            .expect("dead_letter_record");
        assert_eq!(outbox.stats().dead_letters, 1);
        drop(relay);
        outbox.close().expect("close");
    }
}

/// Under a lease shorter than the relay's default renewal interval (10 s),
/// the relay renews by a third of the lease unless told otherwise, so a
/// publish longer than the lease keeps its records.
#[test]
fn the_relay_renews_leases_shorter_than_its_default_interval() {
    let (_t, dir) = tmp();
    let outbox =
        Outbox::open(&dir, Options::default().lease(Duration::from_secs(2))).expect("open");
    outbox.append(b"slow").expect("append");
    let other = outbox.clone();
    let publish = move |records: &[Record]| {
        std::thread::sleep(Duration::from_secs(3));
        assert_eq!(other.stats().claimed_expired, 0, "the lease ran out");
        records.iter().map(|_| Outcome::Stored).collect()
    };
    let mut relay = Relay::new(outbox.clone(), publish, fast());
    assert_eq!(relay.step().expect("step"), 1);
    assert_eq!(relay.stats().published, 1);
    drop(relay);
    outbox.close().expect("close");
}

#[test]
fn run_stops_between_rounds_holding_nothing() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    for i in 0..1000u32 {
        outbox.append(&i.to_le_bytes()).expect("append");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let mut n = 0;
    let publish = move |records: &[Record]| {
        n += 1;
        if n == 3 {
            flag.store(true, std::sync::atomic::Ordering::Release);
        }
        records.iter().map(|_| Outcome::Stored).collect()
    };
    let mut relay = Relay::new(outbox.clone(), publish, fast().batch(100));
    let stats = relay.run(&stop).expect("run");
    assert_eq!(stats.published, 300);
    assert_eq!(stats.lag, 700);
    let s = outbox.stats();
    assert_eq!((s.claimed, s.pending), (0, 700));
    drop(relay);
    outbox.close().expect("close");
}

/// What a broker was given: (seq, payload).
type Published = Arc<Mutex<Vec<(Seq, Vec<u8>)>>>;

/// A claim that fails on one record's bytes does not stop `run`: a record on
/// a range the disk cannot read is held back, records cut short by a damaged
/// segment are set aside, and every other record is published, in order.
#[test]
fn run_goes_on_past_records_it_cannot_read() {
    use segwal::sim::SimDisk;
    use std::path::Path;

    let disk = SimDisk::new(11);
    let dir = Path::new("/outbox");
    let options = Options::default().segment_bytes(16 * 4096);
    let outbox = Outbox::open_with_storage(dir, options, Arc::new(disk.clone())).expect("open");
    let seqs: Vec<Seq> = (0..60u8)
        .map(|i| outbox.append(&[i; 100]).expect("append"))
        .collect();
    let mut files = disk.files(dir);
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    // The third record of the first segment sits on a range that cannot be
    // read; the second segment loses everything from inside its fifth
    // record on.
    assert!(disk.fail_reads_in(&dir.join(&files[0]), 3 * 4096..3 * 4096 + 1));
    assert!(disk.shrink(&dir.join(&files[1]), 5 * 4096 + 10));

    let stop = Arc::new(AtomicBool::new(false));
    let published: Published = Arc::default();
    let (flag, seen, other) = (stop.clone(), published.clone(), outbox.clone());
    let publish = move |records: &[Record]| {
        seen.lock()
            .extend(records.iter().map(|r| (r.seq(), r.payload().to_vec())));
        // The claim in progress holds the last of them: nothing is left
        // to publish once none is pending.
        if other.stats().pending == 0 {
            flag.store(true, std::sync::atomic::Ordering::Release);
        }
        records.iter().map(|_| Outcome::Stored).collect()
    };
    let mut relay = Relay::new(outbox.clone(), publish, fast());
    let stats = relay
        .run(&stop)
        .expect("run goes on past unreadable records");
    let corrupt = outbox.stats().corrupt_records;
    assert!(corrupt >= 1, "the second segment's damage was met");
    // The record on the bad range (held back), and each record cut off (set
    // aside): one failed claim each.
    assert_eq!(stats.unreadable, corrupt + 1, "{stats:?}");
    let published = published.lock().clone();
    assert_eq!(stats.published as usize, published.len());
    assert_eq!(published.len() as u64, 60 - 1 - corrupt);
    assert!(published.windows(2).all(|w| w[0].0 < w[1].0), "in order");
    for (seq, payload) in &published {
        let i = seqs
            .iter()
            .position(|s| s == seq)
            .expect("an appended record");
        assert_eq!(payload, &vec![i as u8; 100], "intact");
    }
    // The one behind the bad range was never published: still claimed.
    assert!(!published.iter().any(|(s, _)| *s == seqs[2]));
    assert_eq!(outbox.stats().claimed, 1);
    drop(relay);
    let _ = outbox.close();
}

/// A relay does not publish from a poisoned outbox, whose acknowledgements
/// can no longer be made durable, even with `sync_acks(false)`.
#[test]
fn a_relay_stops_at_a_poisoned_outbox_before_it_publishes() {
    use segwal::sim::{Fault, FaultRule, SimDisk};

    let disk = SimDisk::new(5);
    let outbox = Outbox::open_with_storage("/outbox", Options::default(), Arc::new(disk.clone()))
        .expect("open");
    for i in 0..10u8 {
        outbox.append(&[i]).expect("append");
    }
    disk.inject(FaultRule {
        fault: Fault::SyncEio,
        at_op: disk.ops(),
        persistent: true,
    });
    assert!(matches!(
        outbox.append(b"lost"),
        Err(segwal::Error::Poisoned { .. })
    ));
    let publish = |_: &[Record]| -> Vec<Outcome> { panic!("published from a poisoned outbox") };
    let mut relay = Relay::new(outbox.clone(), publish, fast().sync_acks(false));
    assert!(matches!(relay.step(), Err(segwal::Error::Poisoned { .. })));
    let stats = outbox.stats();
    assert_eq!((stats.pending, stats.claimed), (10, 0));
    drop(relay);
    let _ = outbox.close();
}

/// Under `ack_durability(Sync)`, a round's acknowledgements share one fsync
/// rather than take one each.
#[test]
fn a_rounds_acknowledgements_share_one_fsync() {
    let (_t, dir) = tmp();
    let options = Options::default().ack_durability(segwal::Durability::Sync);
    let outbox = Outbox::open(&dir, options).expect("open");
    let batch: Vec<&[u8]> = vec![&b"event"[..]; 256];
    outbox.append_batch(&batch).expect("append_batch");
    let publish = |records: &[Record]| records.iter().map(|_| Outcome::Stored).collect();
    let mut relay = Relay::new(outbox.clone(), publish, fast().batch(256).sync_acks(false));
    let before = outbox.stats().fsyncs;
    assert_eq!(relay.step().expect("step"), 256);
    let fsyncs = outbox.stats().fsyncs - before;
    assert_eq!(outbox.stats().pending + outbox.stats().claimed, 0);
    // One for the acknowledgements; a second if the writer's own sync
    // interval fell inside the round. One each would be 256.
    assert!(
        fsyncs <= 2,
        "{fsyncs} fsyncs for one round's acknowledgements"
    );
    drop(relay);
    outbox.close().expect("close");
}

/// When every read fails (a disk gone, a process out of file descriptors),
/// `run` stops after three claims failed reading within one lease, rather
/// than hold back one record a round until the backlog ran out of attempts.
#[test]
fn run_stops_when_the_outboxs_reads_fail_not_one_records() {
    use segwal::sim::SimDisk;

    let disk = SimDisk::new(23);
    let options = Options::default()
        .lease(Duration::from_secs(2))
        .max_attempts(3);
    let outbox =
        Outbox::open_with_storage("/outbox", options, Arc::new(disk.clone())).expect("open");
    for i in 0..60u8 {
        outbox.append(&[i; 100]).expect("append");
    }
    disk.fail_reads(100);
    let publish = |_: &[Record]| -> Vec<Outcome> { panic!("nothing can be read") };
    let mut relay = Relay::new(outbox.clone(), publish, fast());
    // A guard: a relay that never stops is stopped after a minute, and fails.
    let stop = Arc::new(AtomicBool::new(false));
    let guard = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            for _ in 0..600 {
                if stop.load(std::sync::atomic::Ordering::Acquire) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            stop.store(true, std::sync::atomic::Ordering::Release);
        })
    };
    let ran = relay.run(&stop);
    stop.store(true, std::sync::atomic::Ordering::Release);
    guard.join().expect("guard");
    assert!(matches!(ran, Err(segwal::Error::Io { .. })), "{ran:?}");
    assert_eq!(relay.stats().unreadable, 3);
    disk.fail_reads(0);
    let stats = outbox.stats();
    assert_eq!(stats.dead_letters, 0, "{stats:?}");
    assert_eq!(stats.pending + stats.claimed, 60);
    drop(relay);
    outbox.close().expect("close");
}

/// One record that can never be read, and nothing else pending: each time
/// its lease runs out its claim fails again, at most once a lease (with
/// empty rounds between, or none when the relay's wait outlasts the lease);
/// `run` goes on (the reads of the outbox work), and everything else is
/// published.
#[test]
fn one_unreadable_record_on_an_idle_outbox_does_not_stop_run() {
    for wait in [Duration::from_millis(5), Duration::from_millis(300)] {
        one_unreadable_record(wait);
    }
}

fn one_unreadable_record(wait: Duration) {
    use segwal::sim::SimDisk;
    use std::path::Path;

    let disk = SimDisk::new(29);
    let dir = Path::new("/outbox");
    let options = Options::default().lease(Duration::from_millis(100));
    let outbox = Outbox::open_with_storage(dir, options, Arc::new(disk.clone())).expect("open");
    for i in 0..20u8 {
        outbox.append(&[i; 100]).expect("append");
    }
    let file = dir.join(&disk.files(dir)[0]);
    // The third record: each appended alone starts a block after the header's.
    assert!(disk.fail_reads_in(&file, 3 * 4096..3 * 4096 + 1));
    let stop = Arc::new(AtomicBool::new(false));
    // Stops the relay once the record's lease ran out three times (each time
    // its claim failed again), or after a minute.
    let watcher = {
        let (stop, outbox) = (stop.clone(), outbox.clone());
        std::thread::spawn(move || {
            for _ in 0..600 {
                if outbox.stats().claimed_expired >= 3 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            stop.store(true, std::sync::atomic::Ordering::Release);
        })
    };
    let publish = |records: &[Record]| records.iter().map(|_| Outcome::Stored).collect();
    let mut relay = Relay::new(outbox.clone(), publish, fast().wait(wait));
    let ran = relay.run(&stop);
    watcher.join().expect("watcher");
    let stats = ran.expect("run goes on: one record's reads fail, not the outbox's");
    assert_eq!(stats.published, 19);
    assert!(stats.unreadable >= 3, "{stats:?}");
    assert!(outbox.stats().claimed_expired >= 3);
    drop(relay);
    outbox.close().expect("close");
}
