//! Acknowledgements that survive restarts: written to the log with the
//! writer's group commit, read back at open, never a side file.

use std::sync::Arc;
use std::time::Duration;

use segwal::sim::{CrashModel, SimDisk};
use segwal::{Durability, Options, Outbox, Seq};

use crate::{drain, eventually, small_segments, tmp};

fn seqs_of(records: &[segwal::Record]) -> Vec<Seq> {
    records.iter().map(segwal::Record::seq).collect()
}

/// A power cut that keeps nothing that was not fsynced.
const POWER_CUT: CrashModel = CrashModel {
    write_kept: 0,
    write_torn: 0,
    grown_tail: 0,
    dir_change_kept: 0,
    block_garbled: 0,
};

/// A crash of the process: every write kept, synced or not.
const PROCESS_KILLED: CrashModel = CrashModel {
    write_kept: 100,
    write_torn: 0,
    grown_tail: 0,
    dir_change_kept: 100,
    block_garbled: 0,
};

/// Opens an outbox on `disk`, appends six records, claims the first four
/// and acknowledges them (buffered, as `options` say); returns the outbox
/// and the six seqs.
fn six_appended_four_acked(disk: &SimDisk, options: &Options) -> (Outbox, Vec<Seq>) {
    let outbox = Outbox::open_with_storage("/outbox", options.clone(), Arc::new(disk.clone()))
        .expect("open");
    let seqs: Vec<Seq> = (0..6u8)
        .map(|i| outbox.append(&[i]).expect("append"))
        .collect();
    let first = outbox.claim(4).expect("claim");
    assert_eq!(seqs_of(&first), seqs[..4]);
    outbox.ack_many(&seqs_of(&first)).expect("ack");
    (outbox, seqs)
}

/// Waits until a copy of `disk` taken now, crashed as `model` and reopened,
/// delivers `left` and nothing else: until what the outbox still runs on
/// `disk` is made durable against that crash.
fn eventually_a_crash_leaves(
    disk: &SimDisk,
    options: &Options,
    model: CrashModel,
    left: &[Seq],
    what: &str,
) {
    let mut fork = 0;
    eventually(what, || {
        fork += 1;
        let copy = disk.fork(fork);
        copy.crash(model);
        let reopened = Outbox::open_with_storage("/outbox", options.clone(), Arc::new(copy))
            .expect("open the copy");
        seqs_of(&drain(&reopened)) == left
    });
}

#[test]
fn a_record_acknowledged_before_a_close_is_not_delivered_after_it() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    for i in 0..10u8 {
        outbox.append(&[i]).expect("append");
    }
    let records = outbox.claim(4).expect("claim");
    // The default: acknowledgements are buffered, written with the next
    // batch, fsynced at the latest when the outbox closes.
    outbox.ack_many(&seqs_of(&records)).expect("ack");
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, small_segments()).expect("reopen");
    let left: Vec<u8> = drain(&outbox).iter().map(|r| r.payload()[0]).collect();
    assert_eq!(left, (4..10).collect::<Vec<u8>>());
    assert_eq!(outbox.recovery_report().records_recovered, 6);
    outbox.close().expect("close");
}

/// On the simulated disk a power cut keeps only what was fsynced: an
/// acknowledgement made durable (`sync`, or `ack_durability(Sync)`) holds
/// across it; a buffered one may be lost, and then its record comes back.
#[test]
fn a_durable_acknowledgement_survives_a_power_cut() {
    for sync_acks in [false, true] {
        let disk = SimDisk::new(7);
        let options = if sync_acks {
            small_segments().ack_durability(Durability::Sync)
        } else {
            small_segments()
        };
        let open = |options: Options| {
            Outbox::open_with_storage("/outbox", options, Arc::new(disk.clone())).expect("open")
        };
        let outbox = open(options.clone());
        let seqs: Vec<Seq> = (0..30u8)
            .map(|i| outbox.append(&[i]).expect("append"))
            .collect();
        let first = outbox.claim(10).expect("claim");
        outbox.ack_many(&seqs_of(&first)).expect("ack");
        if !sync_acks {
            outbox.sync().expect("sync");
        }
        // Acknowledged after the last sync: buffered, in doubt.
        let second = outbox.claim(5).expect("claim");
        outbox.ack_many(&seqs_of(&second)).expect("ack");
        std::mem::forget(outbox);
        disk.crash(CrashModel::default());
        let outbox = open(options);
        let left = seqs_of(&drain(&outbox));
        assert!(
            !left.iter().any(|s| seqs_of(&first).contains(s)),
            "a durably acknowledged record came back: {left:?}"
        );
        if sync_acks {
            assert_eq!(left, seqs[15..].to_vec(), "ack_durability(Sync)");
        } else {
            // The buffered five may or may not come back; every other record does.
            assert!(left.ends_with(&seqs[15..]), "{left:?}");
            assert!(left.len() == 20 || left.len() == 15, "{left:?}");
        }
    }
}

/// A buffered acknowledgement that no batch of appends takes along is
/// written by the writer thread and fsynced by its timer within the sync
/// interval: nothing else is appended, and a power cut after that fsync
/// keeps it (whether the producer appended on its own thread or not).
#[test]
fn a_buffered_acknowledgement_alone_is_made_durable_after_the_sync_interval() {
    for lone_producer in [true, false] {
        let disk = SimDisk::new(11);
        let options = small_segments()
            .buffered_sync_interval(std::time::Duration::from_millis(50))
            .caller_writes(lone_producer);
        let (outbox, seqs) = six_appended_four_acked(&disk, &options);
        eventually_a_crash_leaves(
            &disk,
            &options,
            POWER_CUT,
            &seqs[4..],
            "the acknowledgement fsynced",
        );
        outbox.close().expect("close");
    }
}

/// With no producer writing its own batches, a buffered acknowledgement
/// reaches the file at once (the writer thread is woken to write it),
/// whatever the sync interval: a crash of the process, which keeps what was
/// written, keeps it; only a power cut in the interval may lose it.
#[test]
fn a_buffered_acknowledgement_reaches_the_file_at_once_when_no_producer_writes() {
    let disk = SimDisk::new(12);
    let options = small_segments()
        .buffered_sync_interval(std::time::Duration::from_secs(3600))
        .caller_writes(false);
    let (outbox, seqs) = six_appended_four_acked(&disk, &options);
    eventually_a_crash_leaves(
        &disk,
        &options,
        PROCESS_KILLED,
        &seqs[4..],
        "the acknowledgement written to the file",
    );
    outbox.close().expect("close");
}

/// A record parked by `max_attempts` in a claim that then waits and hands
/// nothing out (`claim_wait`, `claim_wait_async`) is a dead letter like one
/// `dead_letter` makes, though no append and no hand-out's sync follows: the
/// writer thread is woken to write it at once (a crash of the process keeps
/// it, whatever the sync interval), and fsyncs it within the sync interval
/// (a power cut after that keeps it).
#[test]
fn a_record_parked_by_a_waiting_claim_is_written_like_a_dead_letter() {
    let cases = [
        (POWER_CUT, Duration::from_millis(50), "fsynced"),
        (PROCESS_KILLED, Duration::from_secs(3600), "written at once"),
    ];
    for waits_async in [false, true] {
        for (model, interval, what) in cases {
            let disk = SimDisk::new(14);
            let options = small_segments()
                .max_attempts(1)
                .buffered_sync_interval(interval)
                .caller_writes(false);
            let outbox =
                Outbox::open_with_storage("/outbox", options.clone(), Arc::new(disk.clone()))
                    .expect("open");
            let seq = outbox.append(b"never delivered").expect("append");
            assert_eq!(seqs_of(&outbox.claim(1).expect("claim")), [seq]);
            // Its lease ends at once: the next claim takes it back, delivers
            // it a second time, one over the limit, and parks it instead.
            outbox.extend(seq, Duration::ZERO).expect("extend");
            let wait = Duration::from_millis(20);
            let got = if waits_async {
                pollster::block_on(outbox.claim_wait_async(1, wait))
            } else {
                outbox.claim_wait(1, wait)
            }
            .expect("claim_wait");
            assert!(got.is_empty(), "async {waits_async}: {got:?}");
            assert_eq!(outbox.stats().dead_letters, 1, "async {waits_async}");
            let mut fork = 0;
            eventually(
                &format!("async {waits_async}: the dead letter {what}"),
                || {
                    fork += 1;
                    let copy = disk.fork(fork);
                    copy.crash(model);
                    let reopened =
                        Outbox::open_with_storage("/outbox", options.clone(), Arc::new(copy))
                            .expect("open the copy");
                    reopened.stats().dead_letters == 1 && drain(&reopened).is_empty()
                },
            );
            outbox.close().expect("close");
        }
    }
}

/// A claim that parks one record past `max_attempts` and fails to read
/// another ends before its sync: the writer is woken all the same, so the
/// dead letter and the buffered acknowledgements after it are written and
/// fsynced within the sync interval, not left in memory until some later
/// append or sync.
#[test]
fn a_claim_that_parks_a_record_and_fails_a_read_still_has_its_changes_written() {
    for lone_producer in [false, true] {
        let disk = SimDisk::new(15);
        let options = small_segments()
            .max_attempts(2)
            .buffered_sync_interval(Duration::from_millis(50))
            .caller_writes(lone_producer);
        let outbox = Outbox::open_with_storage("/outbox", options.clone(), Arc::new(disk.clone()))
            .expect("open");
        let a = outbox.append(b"a").expect("append");
        let c = outbox.append(b"c").expect("append");
        assert_eq!(seqs_of(&outbox.claim(2).expect("claim")), [a, c]);
        // Its second delivery, then its lease ends at once: the next claim
        // parks it.
        outbox.extend(a, Duration::ZERO).expect("extend");
        assert_eq!(seqs_of(&outbox.claim(1).expect("claim")), [a]);
        outbox.extend(a, Duration::ZERO).expect("extend");
        outbox.append(b"b").expect("append");
        // The writer goes to sleep with nothing to do.
        std::thread::sleep(Duration::from_millis(300));
        disk.fail_reads(100);
        let failed = outbox.claim(2);
        disk.fail_reads(0);
        assert!(failed.is_err(), "{failed:?}");
        assert_eq!(outbox.stats().dead_letters, 1);
        outbox.ack(c).expect("ack");
        let mut fork = 0;
        eventually("the dead letter and the acknowledgement fsynced", || {
            fork += 1;
            let copy = disk.fork(fork);
            copy.crash(POWER_CUT);
            let reopened = Outbox::open_with_storage("/outbox", options.clone(), Arc::new(copy))
                .expect("open the copy");
            let pending = seqs_of(&drain(&reopened));
            reopened.stats().dead_letters == 1 && !pending.contains(&c)
        });
        outbox.close().expect("close");
    }
}

/// A relay acknowledging each record as a lone producer appends it: the
/// acknowledgements ride with the next batch (mostly the producer's own,
/// the writer thread not woken for each one; how many is a matter of
/// scheduling, measured in docs/BENCHMARKS.md, "A relay's acknowledgements
/// ride with a lone producer's batches"), and that batch's fsync makes them
/// durable with it: after a power cut that keeps nothing unsynced, no record
/// comes back but the last, whose acknowledgement no batch followed.
#[test]
fn a_relay_s_acknowledgements_ride_with_a_lone_producer_s_batches() {
    let disk = SimDisk::new(13);
    let open = || {
        Outbox::open_with_storage("/outbox", small_segments(), Arc::new(disk.clone()))
            .expect("open")
    };
    let outbox = open();
    let rounds = 200u32;
    let mut last = None;
    for i in 0..rounds {
        let seq = outbox.append(&i.to_le_bytes()).expect("append");
        let got = outbox.claim(10).expect("claim");
        assert_eq!(seqs_of(&got), vec![seq]);
        outbox.ack(seq).expect("ack");
        last = Some(seq);
    }
    let stats = outbox.stats();
    assert_eq!(stats.records_appended, u64::from(rounds));
    assert!(stats.caller_batches > 0, "none written by the producer");
    std::mem::forget(outbox);
    disk.crash(POWER_CUT);
    let outbox = open();
    let left = seqs_of(&drain(&outbox));
    assert!(
        left.iter().all(|s| Some(*s) == last),
        "acknowledged records came back: {left:?}"
    );
}

#[test]
fn ack_through_acknowledges_the_claimed_records_up_to_a_seq_and_nothing_else() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    let seqs: Vec<Seq> = (0..40u8)
        .map(|i| outbox.append(&[i]).expect("append"))
        .collect();
    // Claimed: the first 20; pending: the rest.
    let claimed = outbox.claim(20).expect("claim");
    assert_eq!(seqs_of(&claimed), seqs[..20].to_vec());
    // Through the 25th: the 20 claimed ones, not the pending 21st to 25th.
    assert_eq!(outbox.ack_through(seqs[24]).expect("ack_through"), 20);
    assert_eq!(outbox.stats().claimed, 0);
    assert_eq!(outbox.stats().pending, 20);
    // Nothing more to acknowledge there: none, and no error.
    assert_eq!(outbox.ack_through(seqs[24]).expect("again"), 0);
    let next = outbox.claim(10).expect("claim");
    assert_eq!(seqs_of(&next), seqs[20..30].to_vec());
    // Through a seq in the middle of a claim: only those at or below it.
    assert_eq!(outbox.ack_through(seqs[24]).expect("partial"), 5);
    assert_eq!(outbox.stats().claimed, 5);
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, small_segments()).expect("reopen");
    assert_eq!(seqs_of(&drain(&outbox)), seqs[25..].to_vec());
    outbox.close().expect("close");
}

#[test]
fn acknowledged_segments_are_still_deleted_and_acks_do_not_keep_them() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    for round in 0..20u32 {
        for i in 0..30u32 {
            outbox
                .append(&(round * 100 + i).to_le_bytes())
                .expect("append");
        }
        let got = outbox.claim(1000).expect("claim");
        let last = got.last().map(segwal::Record::seq).expect("records");
        assert_eq!(outbox.ack_through(last).expect("ack"), got.len() as u64);
    }
    outbox.sync().expect("sync");
    let stats = outbox.stats();
    assert!(stats.segments_deleted > 10, "{stats:?}");
    assert!(stats.segments <= 3, "{stats:?}");
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, small_segments()).expect("reopen");
    assert!(drain(&outbox).is_empty());
    outbox.close().expect("close");
}

/// Regression: a segment holding only acknowledgements (a relay draining,
/// nothing appended) never rotated, so it grew past `segment_bytes` without
/// bound, and the log with it.
#[test]
fn a_segment_of_acknowledgements_alone_rotates_like_any_other() {
    let (_t, dir) = tmp();
    let options = small_segments().ack_durability(Durability::Sync);
    let outbox = Outbox::open(&dir, options.clone()).expect("open");
    let seqs: Vec<Seq> = (0..150u8)
        .map(|i| outbox.append(&[i]).expect("append"))
        .collect();
    let records = outbox.claim(1000).expect("claim");
    assert_eq!(records.len(), seqs.len());
    // One fsynced acknowledgement at a time: each takes a block of its own.
    for r in &records {
        outbox.ack(r.seq()).expect("ack");
    }
    let limit = 16 * 4096 + 4096;
    for file in crate::segment_files(&dir) {
        let len = std::fs::metadata(&file).expect("stat").len();
        assert!(len <= limit, "{} is {len} bytes", file.display());
    }
    outbox.sync().expect("sync");
    assert!(outbox.stats().segments <= 3, "{:?}", outbox.stats());
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, options).expect("reopen");
    assert!(drain(&outbox).is_empty());
    outbox.close().expect("close");
}

/// Acknowledgements and dead letters made while `close` runs, under both
/// acknowledgement durabilities: each answered Ok is durable once `close`
/// returned Ok, and each answered `Closed` was not made. Three threads settle
/// records across the close, the close at a varying moment; after a power
/// cut and a reopen, the records pending are exactly those not answered Ok.
#[test]
fn a_change_answered_ok_while_close_runs_is_durable_once_close_returns() {
    let mut raced = 0;
    for round in 0..120u64 {
        let acks = if round % 2 == 0 {
            Durability::Buffered
        } else {
            Durability::Sync
        };
        let options = Options::default()
            .ack_durability(acks)
            .buffered_sync_interval(Duration::from_secs(3600));
        let disk = SimDisk::new(round);
        let outbox = Outbox::open_with_storage("/outbox", options.clone(), Arc::new(disk.clone()))
            .expect("open");
        let payloads: Vec<[u8; 4]> = (0..3_000u32).map(|i| i.to_le_bytes()).collect();
        let seqs = outbox.append_batch(&payloads).expect("append");
        assert_eq!(outbox.claim(3_000).expect("claim").len(), 3_000);
        let threads: Vec<_> = (0..3)
            .map(|t| {
                let outbox = outbox.clone();
                let mine: Vec<Seq> = seqs.iter().copied().skip(t).step_by(3).collect();
                std::thread::spawn(move || {
                    let mut done = Vec::new();
                    for (k, seq) in mine.into_iter().enumerate() {
                        let settled = if k % 7 == 0 {
                            outbox.dead_letter(seq, "refused")
                        } else {
                            outbox.ack(seq)
                        };
                        match settled {
                            Ok(()) => done.push(seq),
                            Err(segwal::Error::Closed) => break,
                            Err(e) => panic!("{e}"),
                        }
                    }
                    done
                })
            })
            .collect();
        std::thread::sleep(Duration::from_micros(100 + (round % 40) * 25));
        let closed = outbox.close();
        let done: std::collections::HashSet<Seq> = threads
            .into_iter()
            .flat_map(|t| t.join().expect("acks"))
            .collect();
        raced += usize::from(done.len() < 3_000);
        closed.expect("close");
        disk.crash(POWER_CUT);
        let reopened =
            Outbox::open_with_storage("/outbox", options.clone(), Arc::new(disk.clone()))
                .expect("reopen");
        let back: std::collections::HashSet<Seq> =
            drain(&reopened).into_iter().map(|r| r.seq()).collect();
        let settled_but_back: Vec<&Seq> = back.intersection(&done).collect();
        assert!(
            settled_but_back.is_empty(),
            "round {round} ({acks:?}): settled Ok, back after the close: {settled_but_back:?}"
        );
        let refused_but_settled = seqs
            .iter()
            .filter(|s| !done.contains(s) && !back.contains(s))
            .count();
        assert_eq!(
            refused_but_settled, 0,
            "round {round} ({acks:?}): answered Closed, yet settled on disk"
        );
        reopened.close().expect("close");
    }
    println!("{raced} of 120 closes came while acknowledgements were made");
}

/// Claims racing `close` under `max_attempts(1)`: a record whose attempt
/// the close made durable is handed out, never counted for a delivery that
/// did not happen. After a reopen, the records that become dead letters
/// (delivered once without an acknowledgement) are only records a claim
/// returned.
#[test]
fn a_claim_racing_close_counts_only_the_deliveries_it_made() {
    let options = Options::default().max_attempts(1);
    let mut raced = 0;
    for round in 0..100u64 {
        // A real directory: its fsyncs are slow enough for claims to meet
        // the close.
        let (_t, dir) = tmp();
        let outbox = Outbox::open(&dir, options.clone()).expect("open");
        let payloads: Vec<[u8; 4]> = (0..64u32).map(|i| i.to_le_bytes()).collect();
        outbox.append_batch(&payloads).expect("append");
        let go = Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = (0..3)
            .map(|_| {
                let (outbox, go) = (outbox.clone(), go.clone());
                std::thread::spawn(move || {
                    go.wait();
                    let mut handed = Vec::new();
                    loop {
                        match outbox.claim(1) {
                            Ok(records) if records.is_empty() => return handed,
                            Ok(records) => handed.extend(records.iter().map(|r| r.seq())),
                            Err(segwal::Error::Closed) => return handed,
                            Err(e) => panic!("{e}"),
                        }
                    }
                })
            })
            .collect();
        go.wait();
        // A few claims through, or none, then the close.
        for _ in 0..(round % 7) * 20 {
            std::hint::spin_loop();
        }
        std::thread::yield_now();
        let closed = outbox.close();
        let handed: std::collections::HashSet<Seq> = threads
            .into_iter()
            .flat_map(|t| t.join().expect("claims"))
            .collect();
        raced += usize::from(handed.len() < 64);
        closed.expect("close");
        let reopened = Outbox::open(&dir, options.clone()).expect("reopen");
        drain(&reopened);
        let never_handed: Vec<Seq> = reopened
            .dead_letters(100)
            .expect("dead letters")
            .iter()
            .map(|d| d.seq())
            .filter(|s| !handed.contains(s))
            .collect();
        assert!(
            never_handed.is_empty(),
            "round {round}: dead letters never handed out: {never_handed:?}"
        );
        reopened.close().expect("close");
    }
    println!("{raced} of 100 closes came while records were claimed");
}

/// The seqs pending after a power cut on a copy of `disk` as it is now.
fn pending_after_a_power_cut(disk: &SimDisk, options: &Options, seed: u64) -> Vec<Seq> {
    let copy = disk.fork(seed);
    copy.crash(POWER_CUT);
    let outbox =
        Outbox::open_with_storage("/outbox", options.clone(), Arc::new(copy)).expect("reopen");
    let seqs = drain(&outbox).iter().map(|r| r.seq()).collect();
    outbox.close().expect("close");
    seqs
}

/// Buffered appends, from several threads: a power cut loses what no sync
/// covered, and nothing once `sync`, `close` or a drop returned.
#[test]
fn buffered_appends_survive_a_power_cut_once_sync_close_or_drop_returned() {
    let options = Options::default()
        .durability(Durability::Buffered)
        .buffered_sync_interval(Duration::from_secs(3600));
    for ending in ["sync", "close", "drop"] {
        let disk = SimDisk::new(7);
        let outbox = Outbox::open_with_storage("/outbox", options.clone(), Arc::new(disk.clone()))
            .expect("open");
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let outbox = outbox.clone();
                std::thread::spawn(move || {
                    (0..50u32)
                        .map(|i| {
                            outbox
                                .append(&(t * 1_000 + i).to_le_bytes())
                                .expect("append")
                        })
                        .collect::<Vec<Seq>>()
                })
            })
            .collect();
        let mut answered: Vec<Seq> = threads
            .into_iter()
            .flat_map(|t| t.join().expect("producer"))
            .collect();
        answered.sort();
        match ending {
            "sync" => outbox.sync().expect("sync"),
            "close" => outbox.close().expect("close"),
            _ => drop(outbox),
        }
        assert_eq!(
            pending_after_a_power_cut(&disk, &options, 1),
            answered,
            "after {ending}"
        );
    }
}

/// Under `ack_durability(Sync)` each change of delivery state is durable
/// when its call returns: a power cut right after keeps it.
#[test]
fn sync_acknowledged_changes_survive_a_power_cut_when_the_call_returns() {
    let options = Options::default()
        .ack_durability(Durability::Sync)
        .buffered_sync_interval(Duration::from_secs(3600));
    let disk = SimDisk::new(8);
    let outbox = Outbox::open_with_storage("/outbox", options.clone(), Arc::new(disk.clone()))
        .expect("open");
    let s: Vec<Seq> = (0..8u8)
        .map(|i| outbox.append(&[i]).expect("append"))
        .collect();
    assert_eq!(outbox.claim(8).expect("claim").len(), 8);
    let state = |seed: u64| {
        let copy = disk.fork(seed);
        copy.crash(POWER_CUT);
        let r =
            Outbox::open_with_storage("/outbox", options.clone(), Arc::new(copy)).expect("reopen");
        let st = r.stats();
        let dead: Vec<Seq> = r
            .dead_letters(10)
            .expect("dead letters")
            .iter()
            .map(|d| d.seq())
            .collect();
        r.close().expect("close");
        (st.pending, st.delayed, dead)
    };
    outbox.ack(s[0]).expect("ack");
    assert_eq!(state(1), (7, 0, vec![]));
    assert_eq!(outbox.ack_through(s[2]).expect("ack_through"), 2);
    assert_eq!(state(2), (5, 0, vec![]));
    outbox
        .release_after(s[3], Duration::from_secs(3600), "later")
        .expect("release_after");
    assert_eq!(state(3), (4, 1, vec![]));
    outbox.dead_letter(s[4], "refused").expect("dead letter");
    outbox.dead_letter(s[5], "refused").expect("dead letter");
    assert_eq!(state(4), (2, 1, vec![s[4], s[5]]));
    outbox.requeue(s[4]).expect("requeue");
    assert_eq!(state(5), (3, 1, vec![s[5]]));
    outbox.discard(s[5]).expect("discard");
    assert_eq!(state(6), (3, 1, vec![]));
    outbox.close().expect("close");
}
