//! Deliveries that fail: released with a delay and a reason, or parked as
//! dead letters; all of it durable across restarts.

use std::time::Duration;

use segwal::{Error, Options, Outbox, Seq};

use crate::tmp;

/// A delay long enough that no stall of a loaded test machine lets it pass
/// between two consecutive calls.
const DELAY: Duration = Duration::from_secs(3);

fn options() -> Options {
    Options::default().lease(Duration::from_secs(3600))
}

#[test]
fn a_release_with_a_delay_holds_the_record_back_and_hands_out_the_reason() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options()).expect("open");
    let a = outbox.append(b"a").expect("append");
    let b = outbox.append(b"b").expect("append");
    assert_eq!(outbox.claim(1).expect("claim")[0].seq(), a);
    outbox
        .release_after(a, DELAY, "broker said 503")
        .expect("release_after");
    assert_eq!(outbox.stats().delayed, 1);
    assert_eq!(outbox.stats().claimed, 0);
    // Delayed: the newer record comes out, not the delayed one.
    let next = outbox.claim(10).expect("claim");
    assert_eq!(next.iter().map(|r| r.seq()).collect::<Vec<_>>(), [b]);
    assert_eq!(next[0].last_error(), None);
    // It comes back once the delay has passed (the wait ends then).
    let again = outbox
        .claim_wait(10, Duration::from_secs(60))
        .expect("claim_wait");
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].seq(), again[0].attempt()), (a, 2));
    assert_eq!(again[0].last_error(), Some("broker said 503"));
    assert_eq!(outbox.stats().delayed, 0);
    // Released without a delay: at once, with the reason.
    outbox
        .release_after(a, Duration::ZERO, "try again")
        .expect("release_after");
    let now = outbox.claim(1).expect("claim");
    assert_eq!(
        (now[0].attempt(), now[0].last_error()),
        (3, Some("try again"))
    );
    // Not held by a claim: refused.
    let c = outbox.append(b"c").expect("append");
    assert!(matches!(
        outbox.release_after(c, Duration::ZERO, "x"),
        Err(Error::NotClaimed { seq }) if seq == c
    ));
    outbox.close().expect("close");
}

/// `last_error` is the latest reason given: a plain release or a lease that
/// runs out gives none and leaves it; a restart keeps it; a requeue clears it.
#[test]
fn a_failure_reason_stays_with_its_record_until_it_is_requeued_or_acknowledged() {
    let (_t, dir) = tmp();
    let lease = Duration::from_millis(50);
    let outbox = Outbox::open(&dir, options().lease(lease)).expect("open");
    let a = outbox.append(b"a").expect("append");
    outbox.claim(1).expect("claim");
    outbox
        .release_after(a, Duration::ZERO, "HTTP 503")
        .expect("release_after");
    let reason_of = |outbox: &Outbox| {
        let got = outbox
            .claim_wait(1, Duration::from_secs(60))
            .expect("claim_wait");
        assert_eq!(got.len(), 1);
        got[0].last_error().map(str::to_owned)
    };
    assert_eq!(reason_of(&outbox).as_deref(), Some("HTTP 503"));
    outbox.release(a).expect("release");
    assert_eq!(reason_of(&outbox).as_deref(), Some("HTTP 503"));
    // This claim's lease runs out: the next one still has the reason.
    assert_eq!(reason_of(&outbox).as_deref(), Some("HTTP 503"));
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, options().lease(lease)).expect("reopen");
    assert_eq!(reason_of(&outbox).as_deref(), Some("HTTP 503"));
    outbox.dead_letter(a, "schema").expect("dead_letter");
    outbox.requeue(a).expect("requeue");
    assert_eq!(reason_of(&outbox), None);
    outbox.close().expect("close");
}

#[test]
fn a_delay_and_its_reason_survive_a_restart() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options()).expect("open");
    let a = outbox.append(b"a").expect("append");
    outbox.claim(1).expect("claim");
    let released = std::time::Instant::now();
    outbox
        .release_after(a, DELAY, "timed out")
        .expect("release_after");
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, options()).expect("reopen");
    let stats = outbox.stats();
    let nothing = outbox.claim(1).expect("claim");
    // A machine stalled past the delay between the release and these looks
    // has nothing to say about the delay: the record is due either way.
    if released.elapsed() < DELAY {
        assert_eq!(stats.delayed, 1, "{stats:?}");
        assert!(nothing.is_empty(), "delay forgotten");
    } else {
        eprintln!("the machine stalled past the delay: only its reason is checked");
        let got = nothing.first().map(|r| r.seq());
        assert!(got.is_none() || got == Some(a), "{got:?}");
        if got == Some(a) {
            assert_eq!(nothing[0].last_error(), Some("timed out"));
            outbox.close().expect("close");
            return;
        }
    }
    let got = outbox
        .claim_wait(1, Duration::from_secs(10))
        .expect("claim_wait");
    assert_eq!(got[0].seq(), a);
    assert_eq!(got[0].last_error(), Some("timed out"));
    outbox.close().expect("close");
}

#[test]
fn dead_letters_are_parked_listed_survive_restarts_and_can_be_requeued_or_discarded() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options()).expect("open");
    let seqs: Vec<Seq> = (0..4u8)
        .map(|i| outbox.append(&[b'p', i]).expect("append"))
        .collect();
    // Record 0 fails twice, then is refused for good; record 1 is refused at once.
    for _ in 0..2 {
        assert_eq!(outbox.claim(1).expect("claim")[0].seq(), seqs[0]);
        outbox.release(seqs[0]).expect("release");
    }
    outbox.claim(2).expect("claim");
    outbox
        .dead_letter(seqs[0], "schema rejected")
        .expect("dead");
    outbox.dead_letter(seqs[1], "too large").expect("dead");
    assert!(matches!(
        outbox.dead_letter(seqs[2], "not claimed"),
        Err(Error::NotClaimed { .. })
    ));
    assert_eq!(outbox.stats().dead_letters, 2);
    // Only a dead letter can be requeued or discarded; a number never
    // assigned is unknown.
    for seq in [seqs[2], Seq::from(999_999)] {
        let (requeued, discarded) = (outbox.requeue(seq), outbox.discard(seq));
        if seq == seqs[2] {
            assert!(
                matches!(requeued, Err(Error::NotClaimed { .. })),
                "{requeued:?}"
            );
            assert!(
                matches!(discarded, Err(Error::NotClaimed { .. })),
                "{discarded:?}"
            );
        } else {
            assert!(
                matches!(requeued, Err(Error::UnknownSeq { .. })),
                "{requeued:?}"
            );
            assert!(
                matches!(discarded, Err(Error::UnknownSeq { .. })),
                "{discarded:?}"
            );
        }
    }
    // The message says what was wanted of a record that is not a dead letter.
    let said = outbox
        .requeue(seqs[2])
        .expect_err("not a dead letter")
        .to_string();
    assert!(said.contains("not a dead letter"), "{said}");
    // Never handed out again.
    let rest = outbox.claim(10).expect("claim");
    assert_eq!(rest.iter().map(|r| r.seq()).collect::<Vec<_>>(), seqs[2..]);
    outbox.ack_through(seqs[3]).expect("ack");
    // The number of a batch's fields frame (after its one record) is no
    // record's: unknown to every call.
    let keyed = outbox
        .append_message(&segwal::Message::new(b"k").key(b"key"))
        .expect("append")
        .seq;
    let internal = Seq::from(keyed.get() + 1);
    for (call, got) in [
        ("ack", outbox.ack(internal)),
        ("requeue", outbox.requeue(internal)),
        ("discard", outbox.discard(internal)),
    ] {
        assert!(
            matches!(got, Err(Error::UnknownSeq { seq }) if seq == internal),
            "{call}: {got:?}"
        );
    }
    assert_eq!(outbox.claim(10).expect("claim")[0].seq(), keyed);
    outbox.ack(keyed).expect("ack");
    outbox.close().expect("close");

    let outbox = Outbox::open(&dir, options()).expect("reopen");
    assert!(
        outbox.claim(10).expect("claim").is_empty(),
        "a dead letter came back"
    );
    let dead = outbox.dead_letters(10).expect("dead_letters");
    let listed: Vec<(Seq, u32, &str, &[u8])> = dead
        .iter()
        .map(|d| (d.seq(), d.attempts(), d.reason(), d.payload()))
        .collect();
    assert_eq!(
        listed,
        [
            (seqs[0], 3, "schema rejected", &[b'p', 0][..]),
            (seqs[1], 1, "too large", &[b'p', 1][..]),
        ]
    );
    assert!(dead[0].dead_since() <= std::time::SystemTime::now());
    // Requeued: pending again, from attempt 1; discarded: gone for good.
    outbox.requeue(seqs[0]).expect("requeue");
    outbox.discard(seqs[1]).expect("discard");
    assert!(matches!(
        outbox.requeue(seqs[1]),
        Err(Error::NotClaimed { .. })
    ));
    let back = outbox.claim(10).expect("claim");
    assert_eq!(
        back.iter()
            .map(|r| (r.seq(), r.attempt()))
            .collect::<Vec<_>>(),
        [(seqs[0], 1)]
    );
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, options()).expect("reopen");
    assert_eq!(outbox.stats().dead_letters, 0);
    let last = outbox.claim(10).expect("claim");
    assert_eq!(last.iter().map(|r| r.seq()).collect::<Vec<_>>(), [seqs[0]]);
    outbox.close().expect("close");
}

/// Under `max_attempts` a claim waits for the fsync of the deliveries it
/// counts, and only for that: one that hands nothing out does not make the
/// buffered changes before it (here a release with a delay) durable, so a
/// relay polling an outbox with nothing to hand out costs no fsync a poll.
#[test]
fn a_claim_that_hands_nothing_out_waits_for_no_fsync_under_max_attempts() {
    let (_t, dir) = tmp();
    let options = options()
        .max_attempts(3)
        .buffered_sync_interval(Duration::from_secs(3600));
    let outbox = Outbox::open(&dir, options).expect("open");
    let rounds = 50u64;
    let before = outbox.stats().fsyncs;
    for i in 0..rounds {
        // One fsync for the append, one for the delivery's attempt.
        let seq = outbox.append(&i.to_le_bytes()).expect("append");
        assert_eq!(outbox.claim(10).expect("claim")[0].seq(), seq);
        // Buffered: no fsync of its own. Held back an hour: nothing to claim.
        outbox
            .release_after(seq, Duration::from_secs(3600), "later")
            .expect("release");
        assert!(outbox.claim(10).expect("claim").is_empty());
    }
    let fsyncs = outbox.stats().fsyncs - before;
    // Two a round, and a few the writer may make of its own (zeros ahead); a
    // third a round if each empty claim synced the release before it.
    assert!(
        fsyncs < 2 * rounds + rounds / 2,
        "{fsyncs} fsyncs in {rounds} rounds"
    );
    outbox.close().expect("close");
}

#[test]
fn a_record_delivered_max_attempts_times_becomes_a_dead_letter() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options().max_attempts(3)).expect("open");
    let bad = outbox.append(b"bad").expect("append");
    for attempt in 1..=3 {
        let got = outbox.claim(1).expect("claim");
        assert_eq!((got[0].seq(), got[0].attempt()), (bad, attempt));
        if attempt < 3 {
            outbox.release(bad).expect("release");
        } else {
            outbox
                .release_after(bad, std::time::Duration::ZERO, "503 from the webhook")
                .expect("release_after");
        }
    }
    let good = outbox.append(b"good").expect("append");
    // The fourth delivery would pass the limit: parked instead, and the next
    // record comes out.
    let got = outbox.claim(10).expect("claim");
    assert_eq!(got.iter().map(|r| r.seq()).collect::<Vec<_>>(), [good]);
    let dead = outbox.dead_letters(10).expect("dead_letters");
    assert_eq!((dead[0].seq(), dead[0].attempts()), (bad, 3));
    // It says why, with the last delivery's error.
    assert_eq!(
        dead[0].reason(),
        "delivered 3 times without an acknowledgement (max_attempts); \
         last error: 503 from the webhook"
    );
    outbox.close().expect("close");
}

/// A record that kills the process each time it is delivered: every delivery
/// is written to the log before the record is handed out, so the crashes
/// count, and after `max_attempts` of them the record is dead and the rest
/// flows (on the simulated disk, a power cut at each delivery).
#[test]
fn a_record_that_crashes_every_delivery_is_dead_after_max_attempts_restarts() {
    use std::sync::Arc;

    use segwal::sim::{CrashModel, SimDisk};

    let disk = SimDisk::new(11);
    let open = || {
        Outbox::open_with_storage("/outbox", options().max_attempts(3), Arc::new(disk.clone()))
            .expect("open")
    };
    let outbox = open();
    let killer = outbox.append(b"kills the relay").expect("append");
    let fine = outbox.append(b"fine").expect("append");
    outbox.close().expect("close");
    for attempt in 1..=3 {
        let outbox = open();
        let got = outbox.claim(1).expect("claim");
        assert_eq!((got[0].seq(), got[0].attempt()), (killer, attempt));
        // The relay dies publishing it: the process is gone, nothing synced
        // after the claim.
        std::mem::forget(outbox);
        disk.crash(CrashModel::default());
    }
    let outbox = open();
    let got = outbox.claim(10).expect("claim");
    assert_eq!(got.iter().map(|r| r.seq()).collect::<Vec<_>>(), [fine]);
    let dead = outbox.dead_letters(10).expect("dead_letters");
    assert_eq!((dead[0].seq(), dead[0].attempts()), (killer, 3));
    outbox.close().expect("close");
}

/// Set in the environment of the child relay of the crash-loop test.
const RELAY_CHILD: &str = "SEGWAL_TEST_CRASH_LOOP_DIR";

/// The crash loop, with real processes: a child relay aborts (the process is
/// gone, no destructor runs) every time it is handed one particular record.
/// With `max_attempts(3)` the parent restarts it; after three crashes that
/// record is a dead letter and the child delivers every other one.
#[test]
fn a_relay_that_crashes_on_one_record_stops_crashing_after_max_attempts() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options().max_attempts(3)).expect("open");
    for i in 0..20u8 {
        let payload: &[u8] = if i == 7 { b"poison" } else { &[i] };
        outbox.append(payload).expect("append");
    }
    outbox.close().expect("close");
    let mut crashes = 0;
    let delivered = loop {
        let out = std::process::Command::new(crate::this_binary())
            .args(["--exact", "retries::child_relay_that_crashes_on_poison"])
            .args(["--nocapture", "--test-threads=1"])
            .env(RELAY_CHILD, &dir)
            .output()
            .expect("spawn the child relay");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            break stdout
                .lines()
                .filter_map(|l| l.strip_prefix("segwal-child: delivered "))
                .count();
        }
        crashes += 1;
        assert!(crashes <= 3, "the relay crashed {crashes} times: {stdout}");
    };
    assert_eq!(
        crashes, 3,
        "the poison record was delivered once per allowed attempt"
    );
    let outbox = Outbox::open(&dir, options()).expect("reopen");
    let dead = outbox.dead_letters(10).expect("dead_letters");
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].payload(), dead[0].attempts()), (&b"poison"[..], 3));
    // Every other record was delivered and acknowledged (some of them by the
    // relays that crashed, before they met the poison).
    assert!(outbox.claim(100).expect("claim").is_empty());
    assert!(delivered > 0);
    outbox.close().expect("close");
}

/// The child half: delivers records one at a time, and aborts on the poison.
#[test]
fn child_relay_that_crashes_on_poison() {
    let Some(dir) = std::env::var_os(RELAY_CHILD) else {
        return;
    };
    let outbox = Outbox::open(&dir, options().max_attempts(3)).expect("child open");
    loop {
        let got = outbox.claim(1).expect("claim");
        let Some(record) = got.first() else { break };
        if record.payload() == b"poison" {
            std::process::abort();
        }
        println!("segwal-child: delivered {}", record.seq());
        outbox.ack(record.seq()).expect("ack");
        outbox.sync().expect("sync");
    }
    outbox.close().expect("child close");
}

/// A record released with a delay, or parked as a dead letter, may still be
/// acknowledged (its delivery turned out to have succeeded): it is done,
/// counted as neither any more, never handed out again, across a restart.
#[test]
fn a_delayed_record_or_a_dead_letter_can_still_be_acknowledged() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options()).expect("open");
    let a = outbox.append(b"a").expect("append");
    let b = outbox.append(b"b").expect("append");
    outbox.claim(2).expect("claim");
    outbox
        .release_after(a, Duration::from_secs(3600), "timed out")
        .expect("release_after");
    outbox.dead_letter(b, "refused").expect("dead letter");
    outbox.ack(a).expect("ack of a delayed record");
    outbox.ack(b).expect("ack of a dead letter");
    let stats = outbox.stats();
    assert_eq!((stats.delayed, stats.dead_letters), (0, 0), "{stats:?}");
    assert!(outbox.dead_letters(10).expect("dead letters").is_empty());
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, options()).expect("reopen");
    let stats = outbox.stats();
    assert_eq!(
        (stats.delayed, stats.dead_letters, stats.pending),
        (0, 0, 0),
        "{stats:?}"
    );
    assert!(outbox.claim(10).expect("claim").is_empty());
    outbox.close().expect("close");
}

/// A claim whose read fails on one record puts the others back never handed
/// out: their delivery does not count, in memory or in the log, so failed
/// reads cannot make dead letters of records never delivered (on the
/// simulated disk: seven records of the oldest segment on a range that
/// cannot be read, `max_attempts(2)`, claims of ten).
#[test]
fn records_a_failed_read_put_back_are_not_charged_an_attempt() {
    use std::path::Path;
    use std::sync::Arc;

    use segwal::sim::SimDisk;

    let disk = SimDisk::new(13);
    let dir = Path::new("/outbox");
    let options = options().segment_bytes(16 * 4096).max_attempts(2);
    let open =
        || Outbox::open_with_storage(dir, options.clone(), Arc::new(disk.clone())).expect("open");
    let outbox = open();
    let seqs: Vec<Seq> = (0..60u8)
        .map(|i| outbox.append(&[i; 100]).expect("append"))
        .collect();
    let mut files = disk.files(dir);
    files.sort();
    let first = dir.join(&files[0]);
    // Each record appended alone starts a block; the segment's header
    // takes the first. Records 2 to 8 lie on a range that cannot be read.
    let bad: Vec<usize> = (2..=8).collect();
    assert!(disk.fail_reads_in(&first, 4096 * 3..4096 * 9 + 1));
    // Claims of ten, everything handed out kept claimed; each failed claim
    // holds back its bad record. Every record handed out, in each round of
    // deliveries, is on the same attempt.
    let deliver = |outbox: &Outbox, attempt: u32| {
        let (mut handed, mut failed) = (Vec::new(), 0);
        loop {
            match outbox.claim(10) {
                Ok(records) if records.is_empty() => break,
                Ok(records) => {
                    for r in records {
                        assert_eq!(r.attempt(), attempt, "seq {}", r.seq());
                        handed.push(r.seq());
                    }
                }
                Err(Error::Io { path, .. }) => {
                    assert_eq!(path, first);
                    failed += 1;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(failed, bad.len());
        let expected: Vec<Seq> = (0..seqs.len())
            .filter(|i| !bad.contains(i))
            .map(|i| seqs[i])
            .collect();
        assert_eq!(handed, expected);
        assert!(outbox.dead_letters(10).expect("dead letters").is_empty());
    };
    deliver(&outbox, 1);
    // After a reopen, the counts the log holds: one delivery each.
    outbox.close().expect("close");
    let outbox = open();
    deliver(&outbox, 2);
    outbox.close().expect("close");
}

/// A claim whose attempts cannot be made durable (the fsync fails) hands
/// nothing out and keeps nothing claimed: the records go back to pending.
#[test]
fn a_claim_whose_attempts_cannot_be_synced_keeps_nothing_claimed() {
    use std::sync::Arc;

    use segwal::sim::{Fault, FaultRule, SimDisk};

    let disk = SimDisk::new(17);
    let outbox =
        Outbox::open_with_storage("/outbox", options().max_attempts(3), Arc::new(disk.clone()))
            .expect("open");
    for i in 0..7u8 {
        outbox.append(&[i]).expect("append");
    }
    disk.inject(FaultRule {
        fault: Fault::SyncEio,
        at_op: disk.ops(),
        persistent: true,
    });
    assert!(matches!(outbox.claim(10), Err(Error::Poisoned { .. })));
    let stats = outbox.stats();
    assert_eq!((stats.pending, stats.claimed), (7, 0), "{stats:?}");
    let _ = outbox.close();
}

/// A dead letter parked past `max_attempts` with a long last error keeps the
/// reason the log keeps: the same before and after a reopen.
#[test]
fn a_max_attempts_reason_is_clipped_as_the_log_clips_it() {
    let (_t, dir) = tmp();
    let options = options().max_attempts(1);
    let outbox = Outbox::open(&dir, options.clone()).expect("open");
    let seq = outbox.append(b"x").expect("append");
    assert_eq!(outbox.claim(1).expect("claim").len(), 1);
    let long = "e".repeat(segwal::REASON_BYTES_MAX);
    outbox
        .release_after(seq, Duration::ZERO, &long)
        .expect("release_after");
    assert!(outbox.claim(1).expect("claim").is_empty(), "parked");
    let before = outbox.dead_letters(10).expect("dead letters")[0]
        .reason()
        .to_owned();
    assert_eq!(before.len(), segwal::REASON_BYTES_MAX);
    assert!(before.starts_with("delivered once without an acknowledgement (max_attempts)"));
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, options).expect("reopen");
    assert_eq!(
        outbox.dead_letters(10).expect("dead letters")[0].reason(),
        before
    );
    outbox.close().expect("close");
}

#[test]
fn a_reason_given_to_many_records_is_kept_once_across_restarts() {
    // A relay whose broker is down releases or parks every record it holds
    // with the broker's one error. Each record kept its own copy of the text
    // (up to 1 KiB): 200,000 releases took 358 MiB.
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options()).expect("open");
    let payloads: Vec<Vec<u8>> = (0..200).map(|i| vec![b'r'; 10 + i]).collect();
    outbox.append_batch(&payloads).expect("append");
    let records = outbox.claim(200).expect("claim");
    let released = "connection refused by the broker";
    let refused = "HTTP 410 Gone";
    for r in &records[..100] {
        outbox
            .release_after(r.seq(), Duration::ZERO, released)
            .expect("release");
    }
    for r in &records[100..] {
        outbox.dead_letter(r.seq(), refused).expect("dead letter");
    }
    let one_text = |outbox: &Outbox| {
        let again = outbox.claim(200).expect("claim");
        assert_eq!(again.len(), 100);
        let errors: Vec<&str> = again
            .iter()
            .map(|r| r.last_error().expect("a reason"))
            .collect();
        assert!(errors.iter().all(|e| *e == released));
        assert!(
            errors.iter().all(|e| e.as_ptr() == errors[0].as_ptr()),
            "each released record keeps its own copy of the reason"
        );
        let dead = outbox.dead_letters(200).expect("dead letters");
        assert_eq!(dead.len(), 100);
        assert!(dead.iter().all(|d| d.reason() == refused));
        assert!(
            dead.iter()
                .all(|d| d.reason().as_ptr() == dead[0].reason().as_ptr()),
            "each dead letter keeps its own copy of the reason"
        );
        for r in &again {
            outbox.release(r.seq()).expect("release");
        }
    };
    one_text(&outbox);
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, options()).expect("reopen");
    one_text(&outbox);
    outbox.close().expect("close");
}

#[test]
fn delayed_records_are_counted_in_the_state_memory() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options()).expect("open");
    let plain = outbox.stats().state_bytes;
    let messages: Vec<segwal::Message<'_>> = (0..10_000)
        .map(|_| segwal::Message::new(b"later").delay(Duration::from_secs(3600)))
        .collect();
    outbox.append_messages(&messages).expect("append");
    let stats = outbox.stats();
    assert_eq!(stats.delayed, 10_000);
    // A slot is about 4 bytes; a delayed record also has its due time in two
    // maps, some 40 bytes more, which `state_bytes` used to leave out.
    assert!(
        stats.state_bytes >= plain + 10_000 * 40,
        "{} bytes for 10,000 delayed records",
        stats.state_bytes - plain
    );
    outbox.close().expect("close");
}
