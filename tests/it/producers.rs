//! What producers say about a record: ordering keys, not-before times,
//! deduplication ids and unique items, quotas; each durable across restarts.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use segwal::sim::SimDisk;
use segwal::{Appended, Durability, Error, Message, Options, Outbox, Seq};

use crate::{small_segments, tmp};

fn options() -> Options {
    Options::default().lease(Duration::from_secs(3600))
}

fn seqs(records: &[segwal::Record]) -> Vec<Seq> {
    records.iter().map(|r| r.seq()).collect()
}

fn keyed(outbox: &Outbox, key: &[u8], payload: &[u8]) -> Seq {
    let a = outbox
        .append_message(&Message::new(payload).key(key))
        .expect("append_message");
    assert!(!a.duplicate);
    a.seq
}

#[test]
fn a_key_is_delivered_one_record_at_a_time_in_order_and_other_keys_go_on() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options()).expect("open");
    let a1 = keyed(&outbox, b"account-1", b"a1");
    let b1 = keyed(&outbox, b"account-2", b"b1");
    let a2 = keyed(&outbox, b"account-1", b"a2");
    let plain = outbox.append(b"no key").expect("append");
    let a3 = keyed(&outbox, b"account-1", b"a3");
    let b2 = keyed(&outbox, b"account-2", b"b2");
    // One record per key; the record without a key is not held.
    let got = outbox.claim(100).expect("claim");
    assert_eq!(seqs(&got), [a1, b1, plain]);
    assert_eq!(got[0].key(), Some(&b"account-1"[..]));
    assert_eq!(got[2].key(), None);
    let stats = outbox.stats();
    assert_eq!((stats.blocked_keys, stats.held_by_key), (2, 3));
    assert_eq!((stats.claimed, stats.pending), (3, 0));
    // A held record was never handed out: it cannot be acknowledged.
    assert!(matches!(outbox.ack(a2), Err(Error::NotClaimed { seq }) if seq == a2));
    // The head acknowledged: the key's next record goes.
    outbox.ack(a1).expect("ack");
    assert_eq!(seqs(&outbox.claim(100).expect("claim")), [a2]);
    // Released: the head comes back first, the key stays blocked behind it.
    outbox.release(b1).expect("release");
    assert_eq!(seqs(&outbox.claim(100).expect("claim")), [b1]);
    // Delayed: the key waits with it.
    outbox
        .release_after(b1, Duration::from_secs(3600), "later")
        .expect("release_after");
    assert!(outbox.claim(100).expect("claim").is_empty());
    // A dead letter no longer blocks its key.
    outbox.dead_letter(a2, "refused").expect("dead_letter");
    assert_eq!(seqs(&outbox.claim(100).expect("claim")), [a3]);
    // Requeued while the key's head is claimed: it goes right after it.
    outbox.requeue(a2).expect("requeue");
    assert!(outbox.claim(100).expect("claim").is_empty());
    outbox.ack(a3).expect("ack");
    assert_eq!(seqs(&outbox.claim(100).expect("claim")), [a2]);
    assert_eq!(outbox.stats().held_by_key, 1, "b2 behind the delayed b1");
    let _ = b2;
    outbox.close().expect("close");
}

#[test]
fn per_key_order_holds_across_reopens_and_sealed_segments() {
    let (_t, dir) = tmp();
    let open = || Outbox::open(&dir, small_segments().lease(Duration::from_secs(3600)));
    let outbox = open().expect("open");
    let mut by_key: Vec<Vec<Seq>> = vec![Vec::new(); 3];
    for i in 0..60usize {
        let key = format!("key-{}", i % 3);
        by_key[i % 3].push(keyed(&outbox, key.as_bytes(), &[b'x'; 700]));
    }
    assert!(
        crate::segment_files(&dir).len() > 2,
        "records in sealed segments"
    );
    // Claimed and not acknowledged: after the reopen they are the heads again.
    let first = outbox.claim(100).expect("claim");
    assert_eq!(seqs(&first), [by_key[0][0], by_key[1][0], by_key[2][0]]);
    outbox.ack(by_key[1][0]).expect("ack");
    outbox.sync().expect("sync");
    drop(outbox);
    for round in 0..3 {
        let outbox = open().expect("reopen");
        let got = outbox.claim(100).expect("claim");
        let mut want: Vec<Seq> = if round == 0 {
            vec![by_key[0][0], by_key[1][1], by_key[2][0]]
        } else {
            vec![by_key[0][round], by_key[1][round + 1], by_key[2][round]]
        };
        want.sort();
        assert_eq!(seqs(&got), want, "round {round}");
        for r in &got {
            outbox.ack(r.seq()).expect("ack");
        }
        outbox.close().expect("close");
    }
}

#[test]
fn a_not_before_time_holds_a_record_back_until_it_passes_across_a_reopen() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options()).expect("open");
    // Far enough ahead that the appends, the close and the reopen (a dozen
    // fsyncs) end well before it on a loaded machine.
    let at = SystemTime::now() + Duration::from_secs(5);
    let late = outbox
        .append_message(&Message::new(b"later").not_before(at))
        .expect("append_message")
        .seq;
    let now = outbox.append(b"now").expect("append");
    let far = outbox
        .append_message(&Message::new(b"far").delay(Duration::from_secs(3600)))
        .expect("append_message")
        .seq;
    let got = outbox.claim(10).expect("claim");
    assert_eq!(seqs(&got), [now]);
    assert_eq!(outbox.stats().delayed, 2);
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, options()).expect("reopen");
    assert_eq!(outbox.stats().delayed, 2);
    assert_eq!(seqs(&outbox.claim(10).expect("claim")), [now]);
    // claim_wait wakes when the earliest comes due, and not before it.
    let got = outbox
        .claim_wait(10, Duration::from_secs(60))
        .expect("claim_wait");
    assert!(SystemTime::now() >= at, "handed out early");
    assert_eq!(seqs(&got), [late]);
    let nb = got[0].not_before().expect("not_before");
    let off = nb.duration_since(at).unwrap_or_else(|e| e.duration());
    assert!(off < Duration::from_micros(2), "{off:?}");
    assert_eq!(outbox.stats().delayed, 1, "{far:?} still waits");
    outbox.close().expect("close");
}

#[test]
fn a_key_waits_for_its_delayed_head() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options()).expect("open");
    let head = outbox
        .append_message(
            &Message::new(b"h")
                .key(b"k")
                .delay(Duration::from_secs(3600)),
        )
        .expect("append")
        .seq;
    let next = keyed(&outbox, b"k", b"n");
    let other = keyed(&outbox, b"other", b"o");
    assert_eq!(seqs(&outbox.claim(10).expect("claim")), [other]);
    let stats = outbox.stats();
    assert_eq!(
        (stats.delayed, stats.held_by_key, stats.blocked_keys),
        (1, 1, 1)
    );
    let _ = (head, next);
    outbox.close().expect("close");
}

/// A dead letter requeued while a later record of its key waits out a
/// `release_after` delay waits behind that record, before a restart and
/// after one (a close, or a crash with the changes synced): the delayed
/// record keeps its key's turn while it waits.
#[test]
fn a_requeued_record_waits_behind_its_keys_delayed_record_across_restarts() {
    for crash in [false, true] {
        let disk = SimDisk::new(36);
        let open = || {
            Outbox::open_with_storage(
                "/outbox",
                options().ack_durability(Durability::Sync),
                Arc::new(disk.clone()),
            )
            .expect("open")
        };
        let outbox = open();
        let a = keyed(&outbox, b"k", b"a");
        let b = keyed(&outbox, b"k", b"b");
        let other = keyed(&outbox, b"other", b"o");
        assert_eq!(seqs(&outbox.claim(10).expect("claim")), [a, other]);
        outbox.ack(other).expect("ack");
        outbox.dead_letter(a, "refused").expect("dead letter");
        assert_eq!(seqs(&outbox.claim(10).expect("claim")), [b]);
        outbox
            .release_after(b, Duration::from_secs(3600), "later")
            .expect("release_after");
        outbox.requeue(a).expect("requeue");
        outbox.sync().expect("sync");
        let check = |outbox: &Outbox, when: &str| {
            assert!(outbox.claim(10).expect("claim").is_empty(), "{when}");
            let stats = outbox.stats();
            assert_eq!(
                (stats.delayed, stats.held_by_key, stats.dead_letters),
                (1, 1, 0),
                "{when}"
            );
        };
        check(&outbox, "before a restart");
        let outbox = if crash {
            std::mem::forget(outbox);
            disk.crash(segwal::sim::CrashModel::default());
            open()
        } else {
            outbox.close().expect("close");
            open()
        };
        check(
            &outbox,
            if crash {
                "after a crash"
            } else {
                "after a reopen"
            },
        );
        // An ack of the delayed record (it was delivered) ends its wait: the
        // requeued record goes next.
        outbox.ack(b).expect("ack of the delayed record");
        assert_eq!(seqs(&outbox.claim(10).expect("claim")), [a]);
        outbox.close().expect("close");
    }
}

/// A late acknowledgement of a delivery whose lease ran out is accepted
/// even when the record is now held back behind an older record of its key
/// (a dead letter requeued while it was out): it was delivered. An
/// acknowledgement of a record never handed out, held behind its key or
/// waiting for its own not-before time, is `NotClaimed`.
#[test]
fn a_late_ack_is_accepted_behind_its_key_and_an_ack_of_a_record_never_handed_out_is_not() {
    let (_t, dir) = tmp();
    let outbox =
        Outbox::open(&dir, Options::default().lease(Duration::from_millis(200))).expect("open");
    let z = keyed(&outbox, b"k", b"z");
    let a = keyed(&outbox, b"k", b"a");
    let later = outbox
        .append_message(&Message::new(b"later").delay(Duration::from_secs(3600)))
        .expect("append")
        .seq;
    assert_eq!(seqs(&outbox.claim(10).expect("claim")), [z]);
    outbox.dead_letter(z, "refused").expect("dead letter");
    assert_eq!(seqs(&outbox.claim(10).expect("claim")), [a]);
    outbox
        .requeue(z)
        .expect("requeue: behind the claimed record");
    std::thread::sleep(Duration::from_millis(400));
    // The lease of `a` ran out: the older `z` takes the turn, `a` is held.
    assert_eq!(seqs(&outbox.claim(10).expect("claim")), [z]);
    assert_eq!(outbox.stats().held_by_key, 1);
    outbox.ack(a).expect("a late ack of a delivered record");
    assert_eq!(outbox.stats().held_by_key, 0);
    match outbox.ack(later) {
        Err(Error::NotClaimed { seq }) => assert_eq!(seq, later),
        other => panic!("an ack of a record never handed out: {other:?}"),
    }
    let b = keyed(&outbox, b"k", b"b");
    match outbox.ack(b) {
        Err(Error::NotClaimed { seq }) => assert_eq!(seq, b),
        other => panic!("an ack of a record held behind its key: {other:?}"),
    }
    outbox.ack(z).expect("ack");
    assert_eq!(seqs(&outbox.claim(10).expect("claim")), [b]);
    assert_eq!(outbox.stats().delayed, 1, "the delayed record waits on");
    outbox.close().expect("close");
}

/// One call that gives one deduplication id to two different payloads is
/// refused whole as an invalid message (no record was appended with it
/// before, so there is no `existing` record to name); the same payload twice
/// is one record. A message of `max_record_bytes` with every optional field
/// is accepted by the smallest queue the options allow.
#[test]
fn one_call_with_an_id_on_two_payloads_is_refused_and_a_full_message_fits_the_queue() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options()).expect("open");
    let before = outbox.append(b"before").expect("append");
    let call = [
        Message::new(b"one").dedup_id(b"id-1"),
        Message::new(b"two").dedup_id(b"id-1"),
    ];
    match outbox.append_messages(&call) {
        Err(Error::InvalidMessage { field, reason }) => {
            assert_eq!(field, "dedup_id");
            assert!(reason.contains("id-1"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let next = outbox.append(b"next").expect("append");
    assert_eq!(next.get(), before.get() + 1, "nothing was written");
    let same = [
        Message::new(b"one").dedup_id(b"id-1"),
        Message::new(b"one").dedup_id(b"id-1"),
    ];
    let got = outbox.append_messages(&same).expect("append_messages");
    assert_eq!((got[0].duplicate, got[1].duplicate), (false, true));
    assert_eq!(got[0].seq, got[1].seq);
    outbox.close().expect("close");

    let (_t, dir) = tmp();
    let small = Options::default().max_record_bytes(100).queue_bytes(148);
    let outbox = Outbox::open(&dir, small).expect("the smallest queue for the records");
    let full = Message::new(&[7u8; 100])
        .key(&[b'k'; 256])
        .dedup_id(&[b'd'; 256])
        .delay(Duration::from_millis(1));
    let a = outbox
        .append_message(&full)
        .expect("a full message alone fits");
    assert!(!a.duplicate);
    outbox.close().expect("close");
}

/// The same rule where one of the two is a unique item, whose id is derived
/// from its payload and given explicitly to the other message (a caller
/// that read it back with `Record::dedup_id`): the call is refused whole,
/// and names no record. It was answered `Conflict` with a number planned in
/// the refused call, never written, which the next append then took.
#[test]
fn one_call_giving_a_unique_items_id_to_another_payload_is_refused() {
    let (_t, dir) = tmp();
    // A window the first unique item leaves at once: nothing appended
    // before holds the id when the call comes.
    let options = options().dedup_window(Duration::from_millis(1));
    let outbox = Outbox::open(&dir, options).expect("open");
    outbox
        .append_message(&Message::new(b"P").unique())
        .expect("append");
    let first = outbox.claim(1).expect("claim");
    let id = first[0].dedup_id().expect("a unique item's id").to_vec();
    outbox.ack(first[0].seq()).expect("ack");
    // Out of the window: ids are timed to the sixteenth of a second, and
    // kept a tick past the window.
    std::thread::sleep(Duration::from_millis(300));
    let last = outbox.stats().last_seq.expect("a record");
    let call = [
        Message::new(b"P").unique(),
        Message::new(b"Q").dedup_id(&id),
    ];
    match outbox.append_messages(&call) {
        Err(Error::InvalidMessage { field, reason }) => {
            assert_eq!(field, "dedup_id");
            assert!(reason.contains("unique:"), "{reason}");
        }
        other => panic!("expected InvalidMessage, got {other:?}"),
    }
    assert_eq!(outbox.stats().last_seq, Some(last), "nothing was written");
    outbox.append(b"next").expect("append");
    let payloads: Vec<Vec<u8>> = crate::drain_ack(&outbox);
    assert_eq!(payloads, [b"next".to_vec()], "neither message was written");
    // Either order, and with the id given first.
    let reversed = [
        Message::new(b"Q").dedup_id(&id),
        Message::new(b"P").unique(),
    ];
    assert!(matches!(
        outbox.append_messages(&reversed),
        Err(Error::InvalidMessage {
            field: "dedup_id",
            ..
        })
    ));
    // The same payload under both: one record.
    let same = [
        Message::new(b"P").unique(),
        Message::new(b"P").dedup_id(&id),
    ];
    let got = outbox.append_messages(&same).expect("append_messages");
    assert_eq!(got[0].seq, got[1].seq);
    assert_eq!((got[0].duplicate, got[1].duplicate), (false, true));
    outbox.close().expect("close");
}

/// A relay waiting in `claim_wait` for a key's next record is woken by the
/// acknowledgement (or the dead letter) that passes the key's turn to it,
/// not by the writer's next batch, which under a long sync interval and no
/// appends never comes.
#[test]
fn an_ack_that_passes_a_keys_turn_wakes_a_waiting_relay() {
    let (_t, dir) = tmp();
    let outbox = Arc::new(
        Outbox::open(
            &dir,
            options().buffered_sync_interval(Duration::from_secs(3600)),
        )
        .expect("open"),
    );
    let a = keyed(&outbox, b"k", b"a");
    let b = keyed(&outbox, b"k", b"b");
    let c = keyed(&outbox, b"k", b"c");
    assert_eq!(seqs(&outbox.claim(10).expect("claim")), [a]);
    for (done, next) in [(a, b), (b, c)] {
        let waiter = {
            let outbox = outbox.clone();
            std::thread::spawn(move || {
                let started = std::time::Instant::now();
                let got = outbox.claim_wait(10, Duration::from_secs(60));
                (got, started.elapsed())
            })
        };
        // The waiter may or may not be waiting yet: either way it must get
        // `next` long before its minute is up.
        std::thread::sleep(Duration::from_millis(50));
        if done == a {
            outbox.ack(done).expect("ack");
        } else {
            outbox.dead_letter(done, "refused").expect("dead letter");
        }
        let (got, waited) = waiter.join().expect("waiter");
        assert_eq!(seqs(&got.expect("claim_wait")), [next]);
        assert!(
            waited < Duration::from_secs(30),
            "woken only by its timeout"
        );
    }
    outbox.close().expect("close");
}

#[test]
fn a_dedup_id_appends_once_and_a_different_payload_conflicts() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options()).expect("open");
    let m = Message::new(b"order 7781 created").dedup_id(b"order-7781/created");
    let first = outbox.append_message(&m).expect("append");
    assert!(!first.duplicate);
    let again = outbox.append_message(&m).expect("append");
    assert_eq!(
        again,
        Appended {
            seq: first.seq,
            duplicate: true
        }
    );
    let other = Message::new(b"something else").dedup_id(b"order-7781/created");
    match outbox.append_message(&other) {
        Err(Error::Conflict { dedup_id, existing }) => {
            assert_eq!(dedup_id, b"order-7781/created");
            assert_eq!(existing, first.seq);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(outbox.stats().records_appended, 1);
    assert_eq!(outbox.stats().duplicates, 1);
    let got = outbox.claim(10).expect("claim");
    assert_eq!(seqs(&got), [first.seq]);
    assert_eq!(got[0].dedup_id(), Some(&b"order-7781/created"[..]));
    // Within one call: the second of two equal messages is the first's
    // duplicate; a conflict refuses the whole call.
    let a = Message::new(b"a").dedup_id(b"id-a");
    let v = outbox
        .append_messages(&[a.clone(), a])
        .expect("append_messages");
    assert_eq!(
        (v[0].duplicate, v[1].duplicate, v[1].seq),
        (false, true, v[0].seq)
    );
    let before = outbox.stats().records_appended;
    let fresh = Message::new(b"fresh").dedup_id(b"id-fresh");
    assert!(matches!(
        outbox.append_messages(&[fresh.clone(), Message::new(b"b").dedup_id(b"id-a")]),
        Err(Error::Conflict { existing, .. }) if existing == v[0].seq
    ));
    assert_eq!(outbox.stats().records_appended, before, "nothing written");
    assert!(!outbox.append_message(&fresh).expect("append").duplicate);
    outbox.close().expect("close");
}

#[test]
fn an_id_stays_known_after_its_record_is_acknowledged_deleted_and_the_outbox_reopened() {
    let (_t, dir) = tmp();
    let open = || Outbox::open(&dir, small_segments());
    let outbox = open().expect("open");
    let m = Message::new(b"once").dedup_id(b"the-id");
    let first = outbox.append_message(&m).expect("append").seq;
    // Acknowledge it and enough after it that its segment is deleted.
    for i in 0..80u32 {
        outbox.append(&i.to_le_bytes()).expect("append");
    }
    crate::drain_ack(&outbox);
    outbox.sync().expect("sync");
    assert!(
        outbox.stats().segments_deleted > 0,
        "the record's segment is gone"
    );
    assert!(outbox.stats().first_seq.is_none());
    assert_eq!(
        outbox.append_message(&m).expect("append"),
        Appended {
            seq: first,
            duplicate: true
        }
    );
    outbox.close().expect("close");
    // Across reopens, and after more deletions that carry the tombstone on.
    for round in 0..3 {
        let outbox = open().expect("reopen");
        assert_eq!(
            outbox.stats().dedup_ids,
            1,
            "round {round}: remembered at open"
        );
        assert_eq!(
            outbox.append_message(&m).expect("append"),
            Appended {
                seq: first,
                duplicate: true
            },
            "round {round}"
        );
        for i in 0..80u32 {
            outbox.append(&i.to_le_bytes()).expect("append");
        }
        crate::drain_ack(&outbox);
        outbox.close().expect("close");
    }
}

#[test]
fn racing_producers_with_one_id_get_one_record() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options()).expect("open");
    for round in 0..20u32 {
        let id = format!("race-{round}");
        let answers: Vec<Appended> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    let outbox = outbox.clone();
                    let id = id.clone();
                    s.spawn(move || {
                        outbox
                            .append_message(&Message::new(b"same").dedup_id(id.as_bytes()))
                            .expect("append")
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("join"))
                .collect()
        });
        let written = answers.iter().filter(|a| !a.duplicate).count();
        assert_eq!(written, 1, "round {round}: {answers:?}");
        assert!(answers.iter().all(|a| a.seq == answers[0].seq));
    }
    assert_eq!(outbox.stats().records_appended, 20);
    outbox.close().expect("close");
}

#[test]
fn unique_items_are_appended_once_while_known_and_again_after_the_window() {
    let (_t, dir) = tmp();
    // A window that the second append, right after the first one's fsync,
    // falls inside however slow that fsync is on a busy machine.
    let outbox = Outbox::open(&dir, options().dedup_window(Duration::from_secs(1))).expect("open");
    let m = Message::new(b"resync repo 42").unique();
    let first = outbox.append_message(&m).expect("append");
    assert_eq!(
        outbox.append_message(&m).expect("append"),
        Appended {
            seq: first.seq,
            duplicate: true
        }
    );
    assert!(
        !outbox
            .append_message(&Message::new(b"resync repo 43").unique())
            .expect("append")
            .duplicate
    );
    let got = outbox.claim(1).expect("claim");
    assert!(
        got[0]
            .dedup_id()
            .is_some_and(|id| id.starts_with(b"unique:"))
    );
    // Well past the window (and its sixteenth-of-a-second grain): new again.
    std::thread::sleep(Duration::from_millis(1_300));
    let later = outbox.append_message(&m).expect("append");
    assert!(!later.duplicate && later.seq > first.seq);
    outbox.close().expect("close");
}

#[test]
fn the_capacity_forgets_the_oldest_ids_first() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options().dedup_capacity(100)).expect("open");
    let ids: Vec<String> = (0..150).map(|i| format!("id-{i}")).collect();
    let msgs: Vec<Message<'_>> = ids
        .iter()
        .map(|id| Message::new(b"p").dedup_id(id.as_bytes()))
        .collect();
    outbox.append_messages(&msgs).expect("append");
    assert_eq!(outbox.stats().dedup_ids, 100);
    assert!(
        !outbox.append_message(&msgs[0]).expect("append").duplicate,
        "forgotten"
    );
    assert!(
        outbox.append_message(&msgs[149]).expect("append").duplicate,
        "kept"
    );
    outbox.close().expect("close");
}

#[test]
fn backlog_quotas_refuse_an_append_at_once_and_writing_nothing() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(
        &dir,
        options().max_backlog_records(3).max_backlog_bytes(1000),
    )
    .expect("open");
    for _ in 0..3 {
        outbox.append(b"x").expect("append");
    }
    match outbox.append(b"y") {
        Err(Error::QuotaExceeded {
            quota,
            limit,
            current,
        }) => {
            assert_eq!((quota, limit, current), ("max_backlog_records", 3, 3));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(outbox.stats().records_appended, 3, "nothing written");
    // A duplicate writes nothing: never refused.
    let got = outbox.claim(1).expect("claim");
    outbox.ack(got[0].seq()).expect("ack");
    let m = Message::new(b"m").dedup_id(b"m");
    outbox.append_message(&m).expect("append");
    assert!(outbox.append_message(&m).expect("append").duplicate);
    // Acknowledged records free room; bytes are counted too.
    for r in outbox.claim(10).expect("claim") {
        outbox.ack(r.seq()).expect("ack");
    }
    assert!(matches!(
        outbox.append(&[0u8; 1001]),
        Err(Error::QuotaExceeded {
            quota: "max_backlog_bytes",
            limit: 1000,
            current: 0
        })
    ));
    assert!(matches!(
        outbox.append_batch(&[[0u8; 10]; 4]),
        Err(Error::QuotaExceeded {
            quota: "max_backlog_records",
            ..
        })
    ));
    outbox.append_batch(&[[0u8; 10]; 3]).expect("append_batch");
    outbox.close().expect("close");
}

/// Under buffered durability, the records written since the last sync count
/// towards the quotas also when the append that meets them fills the segment:
/// the rotation's sync moves them into the table's backlog, read before it.
#[test]
fn backlog_quotas_count_unsynced_records_across_a_rotation() {
    let buffered = || {
        Options::default()
            .durability(Durability::Buffered)
            .buffered_sync_interval(Duration::from_secs(30))
            .min_free_disk_bytes(0)
    };
    // A batch that rotates, on top of 19 records not yet synced.
    let (_t, dir) = tmp();
    let options = buffered()
        .segment_bytes(32 << 10)
        .max_backlog_records(20)
        .max_backlog_bytes(20 * 1000);
    let outbox = Outbox::open(&dir, options).expect("open");
    for _ in 0..19 {
        outbox.append(&[1u8; 1000]).expect("append");
    }
    let batch = vec![[2u8; 1000]; 20];
    match outbox.append_batch(&batch) {
        Err(Error::QuotaExceeded {
            quota: "max_backlog_records",
            limit: 20,
            current: 19,
        }) => {}
        other => panic!("{other:?}"),
    }
    outbox.sync().expect("sync");
    let stats = outbox.stats();
    assert_eq!((stats.pending, stats.backlog_bytes), (19, 19 * 1000));
    outbox.close().expect("close");

    // Single appends, each rotation on top of what is not yet synced.
    let (_t, dir) = tmp();
    let options = buffered().segment_bytes(16 << 10).max_backlog_records(10);
    let outbox = Outbox::open(&dir, options).expect("open");
    let mut accepted = 0;
    for _ in 0..30 {
        match outbox.append(&[3u8; 1000]) {
            Ok(_) => accepted += 1,
            Err(Error::QuotaExceeded { current: 10, .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    outbox.sync().expect("sync");
    assert_eq!((accepted, outbox.stats().pending), (10, 10));
    outbox.close().expect("close");
}

/// The byte quota counts an append as `Stats::backlog_bytes` counts the
/// backlog (payload and optional fields, no frame header), whether the records
/// before it are synced or still waiting for their sync.
#[test]
fn the_byte_quota_counts_an_append_as_the_backlog_counts_it() {
    let (t, _) = tmp();
    let dir = t.path();
    // 90 bytes of payload fit a quota of 100; with a 20-byte key (23 bytes
    // of optional fields) the record is 113 bytes, and is refused.
    let outbox = Outbox::open(dir.join("keyed"), options().max_backlog_bytes(100)).expect("open");
    match outbox.append_message(&Message::new(&[7u8; 90]).key(&[b'k'; 20])) {
        Err(Error::QuotaExceeded {
            quota,
            limit,
            current,
        }) => assert_eq!((quota, limit, current), ("max_backlog_bytes", 100, 0)),
        other => panic!("a keyed record over the quota: {other:?}"),
    }
    outbox
        .append_message(&Message::new(&[7u8; 77]).key(&[b'k'; 20]))
        .expect("77 + 23 bytes: exactly the quota");
    assert_eq!(outbox.stats().backlog_bytes, 100);
    outbox.close().expect("close");

    // Buffered appends are counted before their sync as after it: ten
    // records of 100 bytes fill a quota of 1000, the eleventh is refused.
    let outbox = Outbox::open(
        dir.join("buffered"),
        options()
            .max_backlog_bytes(1000)
            .durability(Durability::Buffered)
            .buffered_sync_interval(Duration::from_secs(3600)),
    )
    .expect("open, buffered");
    for i in 0..10u8 {
        outbox.append(&[i; 100]).expect("within the quota");
    }
    match outbox.append(&[10u8; 100]) {
        Err(Error::QuotaExceeded {
            quota,
            limit,
            current,
        }) => assert_eq!((quota, limit, current), ("max_backlog_bytes", 1000, 1000)),
        other => panic!("the eleventh record: {other:?}"),
    }
    outbox.sync().expect("sync");
    assert_eq!(outbox.stats().backlog_bytes, 1000);
    assert!(matches!(
        outbox.append(&[10u8; 1]),
        Err(Error::QuotaExceeded {
            quota: "max_backlog_bytes",
            current: 1000,
            ..
        })
    ));
    outbox.close().expect("close");
}

/// A file kept for recycling is space the next segment is written into: the
/// free-disk floor counts it as free, and refuses the same append when
/// recycling is off and the file was deleted.
#[test]
fn the_free_disk_floor_counts_a_file_kept_for_recycling_as_free() {
    for recycle in [true, false] {
        let disk = SimDisk::new(6);
        let options = small_segments()
            .lease(Duration::from_secs(3600))
            .recycle_segments(recycle)
            .min_free_disk_bytes(32 << 10);
        let outbox =
            Outbox::open_with_storage("/outbox", options, Arc::new(disk.clone())).expect("open");
        // Three segments' worth, one block each, all acknowledged: the
        // oldest segments are deleted, the newest of them kept if recycling.
        for i in 0..40u8 {
            outbox.append(&[i; 1000]).expect("append");
        }
        let got = outbox.claim(100).expect("claim");
        outbox.ack_many(&seqs(&got)).expect("ack");
        outbox.sync().expect("sync: the deletions done");
        let spares: Vec<String> = disk
            .files(std::path::Path::new("/outbox"))
            .into_iter()
            .filter(|name| name.ends_with(".seg.free"))
            .collect();
        assert_eq!(spares.len(), usize::from(recycle), "{spares:?}");
        disk.set_free_bytes(Some(4096));
        // The free space is asked again at most every 10 ms.
        std::thread::sleep(Duration::from_millis(30));
        match (recycle, outbox.append(b"after")) {
            (true, Ok(_)) => {}
            (false, Err(Error::QuotaExceeded { quota, current, .. })) => {
                assert_eq!((quota, current), ("min_free_disk_bytes", 4096))
            }
            (recycle, other) => panic!("recycling {recycle}: {other:?}"),
        }
        outbox.close().expect("close");
    }
}

#[test]
fn the_free_disk_floor_refuses_appends_but_not_acks_claims_or_recovery() {
    let disk = SimDisk::new(5);
    let open = || {
        Outbox::open_with_storage(
            "/outbox",
            options().min_free_disk_bytes(1 << 20),
            Arc::new(disk.clone()),
        )
    };
    let outbox = open().expect("open");
    let a = outbox
        .append(b"a")
        .expect("append: the disk cannot tell, no floor");
    disk.set_free_bytes(Some(4096));
    // The free space is asked again at most every 10 ms.
    std::thread::sleep(Duration::from_millis(30));
    match outbox.append(b"b") {
        Err(Error::QuotaExceeded {
            quota,
            limit,
            current,
        }) => {
            assert_eq!(
                (quota, limit, current),
                ("min_free_disk_bytes", 1 << 20, 4096)
            );
        }
        other => panic!("{other:?}"),
    }
    let got = outbox.claim(10).expect("claim");
    assert_eq!(seqs(&got), [a]);
    outbox.ack(a).expect("ack");
    outbox.sync().expect("sync");
    outbox.close().expect("close");
    let outbox = open().expect("recovery needs no free space");
    assert!(outbox.claim(10).expect("claim").is_empty());
    disk.set_free_bytes(Some(2 << 20));
    std::thread::sleep(Duration::from_millis(30));
    outbox.append(b"c").expect("room again");
    outbox.close().expect("close");
}

#[test]
fn message_fields_out_of_range_are_refused_before_anything_is_written() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options()).expect("open");
    assert!(matches!(
        outbox.append_message(&Message::new(b"x").key(b"")),
        Err(Error::InvalidMessage { field: "key", .. })
    ));
    assert!(matches!(
        outbox.append_message(&Message::new(b"x").dedup_id(&[1u8; 257])),
        Err(Error::InvalidMessage {
            field: "dedup_id",
            ..
        })
    ));
    assert_eq!(outbox.stats().records_appended, 0);
    // At the limits: accepted, and read back exactly.
    let key = [7u8; 256];
    let id = [9u8; 256];
    let a = outbox
        .append_message(&Message::new(b"x").key(&key).dedup_id(&id))
        .expect("append");
    let got = outbox.claim(1).expect("claim");
    assert_eq!(got[0].seq(), a.seq);
    assert_eq!(
        (got[0].key(), got[0].dedup_id()),
        (Some(&key[..]), Some(&id[..]))
    );
    assert_eq!(got[0].payload(), b"x");
    outbox.close().expect("close");
}

#[test]
fn the_free_disk_floor_reads_the_real_file_system() {
    let (_t, dir) = tmp();
    // No disk has 16 EiB free.
    let outbox = Outbox::open(&dir, options().min_free_disk_bytes(u64::MAX)).expect("open");
    match outbox.append(b"x") {
        Err(Error::QuotaExceeded {
            quota,
            limit,
            current,
        }) => {
            assert_eq!((quota, limit), ("min_free_disk_bytes", u64::MAX));
            assert!(current > 0 && current < u64::MAX, "{current}");
        }
        other => panic!("{other:?}"),
    }
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, options().min_free_disk_bytes(1)).expect("open");
    outbox
        .append(b"x")
        .expect("append above a floor of one byte");
    outbox.close().expect("close");
}

/// Appends `count` records, each with its own id (`prefix-k`) if `ids`,
/// and acknowledges them all, `per_batch` at a time.
fn append_and_ack(outbox: &Outbox, prefix: &str, count: usize, per_batch: usize, ids: bool) {
    let payload = [7u8; 100];
    for first in (0..count).step_by(per_batch) {
        let names: Vec<String> = (first..(first + per_batch).min(count))
            .map(|k| format!("{prefix}-{k}"))
            .collect();
        let messages: Vec<Message> = names
            .iter()
            .map(|id| match ids {
                true => Message::new(&payload).dedup_id(id.as_bytes()),
                false => Message::new(&payload),
            })
            .collect();
        let appended = outbox.append_messages(&messages).expect("append");
        assert!(appended.iter().all(|a| !a.duplicate));
        crate::drain_ack(outbox);
    }
}

/// A deletion carries the ids still in the window whose frames it removes
/// into a tombstones frame in the active segment. With more ids in the
/// window than a segment holds, that frame filled the next segment deleted,
/// and every deletion wrote every id again (70 bytes written per byte
/// appended with 2 MiB segments and 100,000 ids). A deletion now waits until
/// it frees four times what it carries; the ids stay known; once they leave
/// the window, the segments kept for them go.
#[test]
fn many_ids_in_small_segments_are_not_written_again_at_every_deletion() {
    let (_t, dir) = tmp();
    // Long enough for the appends of a slow debug build to stay in it.
    let window = Duration::from_secs(20);
    let opts = || small_segments().dedup_window(window);
    let outbox = Outbox::open(&dir, opts()).expect("open");
    // 20,000 ids: 640 KB of tombstones, ten times a 64 KiB segment.
    let ids = 20_000;
    append_and_ack(&outbox, "id", ids, 25, true);
    outbox.sync().expect("sync");
    let stats = outbox.stats();
    // The same appends without ids, for the segments they fill.
    let (_t2, plain_dir) = tmp();
    let plain = Outbox::open(&plain_dir, opts()).expect("open");
    append_and_ack(&plain, "id", ids, 25, false);
    plain.sync().expect("sync");
    let without = plain.stats().segments_deleted;
    // And with space short (under twice the free-disk floor, above the
    // floor): a deletion waits less, but still waits.
    let disk = SimDisk::new(34);
    disk.set_free_bytes(Some(48 << 20));
    let short = Outbox::open_with_storage(
        "/outbox",
        opts().min_free_disk_bytes(32 << 20),
        Arc::new(disk.clone()),
    )
    .expect("open");
    append_and_ack(&short, "id", ids, 25, true);
    short.sync().expect("sync");
    let short_deleted = short.stats().segments_deleted;
    assert!(
        short_deleted <= without * 4,
        "{short_deleted} segments deleted with space short, {without} without ids",
    );
    short.close().expect("close");
    // The ids' fields frames take more room (with 25 records a batch, two
    // blocks a batch where one does without ids); the tombstones at most a
    // third more again. Carried at every deletion, they took 12 times as
    // many segments.
    assert!(
        stats.segments_deleted <= without * 3,
        "{} segments deleted with ids, {without} without",
        stats.segments_deleted
    );
    assert!(stats.held_for_ids > 0, "{stats:?}");
    assert_eq!(stats.held_by_records, 0);
    // Every id is still known, and across a reopen too.
    let probe = |outbox: &Outbox, k: usize| {
        let id = format!("id-{k}");
        outbox
            .append_message(&Message::new(&[7u8; 100]).dedup_id(id.as_bytes()))
            .expect("append")
            .duplicate
    };
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, opts()).expect("reopen");
    // The open weighs the deletion again and holds it: said at once.
    let reopened = outbox.stats();
    assert!(reopened.held_for_ids > 0, "{reopened:?}");
    for k in [0, 1, ids / 2, ids - 1] {
        assert!(probe(&outbox, k), "id-{k} forgotten");
    }
    // Once the ids have left the window, the segments go, with nothing
    // appended or acknowledged meanwhile.
    std::thread::sleep(window);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let stats = outbox.stats();
        if stats.held_for_ids == 0 && stats.segments == 1 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "segments still held after the window: {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!probe(&outbox, 0), "id-0 outlived its window");
}

/// Acknowledged segments left at a close (here held back for their ids) go
/// once the next open finds their ids out of the window, with nothing
/// appended, claimed or acknowledged; the records left pending stay.
#[test]
fn acknowledged_segments_left_at_a_close_go_after_the_next_open() {
    let (_t, dir) = tmp();
    let window = |w| small_segments().dedup_window(w);
    let outbox = Outbox::open(&dir, window(Duration::from_secs(600))).expect("open");
    append_and_ack(&outbox, "id", 20_000, 25, true);
    // Two records left pending, in one segment.
    outbox
        .append_batch(&[&b"first"[..], b"second"])
        .expect("append");
    outbox.sync().expect("sync");
    assert!(outbox.stats().held_for_ids > 0, "{:?}", outbox.stats());
    outbox.close().expect("close");
    let before = crate::segment_files(&dir).len();
    assert!(before > 2, "{before} segments");
    // Reopened with a window the ids have left: nothing to carry. Left: the
    // segment of the two pending records, and the one the open made.
    let outbox = Outbox::open(&dir, window(Duration::from_millis(1))).expect("reopen");
    crate::eventually("the acknowledged segments deleted", || {
        outbox.stats().segments == 2
    });
    assert_eq!(crate::segment_files(&dir).len(), 2);
    assert_eq!(outbox.stats().held_for_ids, 0);
    assert_eq!(outbox.stats().pending, 2);
    let first = outbox.claim(1).expect("claim");
    assert_eq!(first[0].payload(), b"first");
    outbox.ack(first[0].seq()).expect("ack");
    assert_eq!(outbox.stats().pending, 1);
}

/// Deletions held back for their ids go once the disk fills up: with
/// appends refused for want of space, a deletion waits only while it would
/// write more than it frees; a refused append is enough to have it weighed
/// again.
#[test]
fn held_deletions_go_when_the_disk_fills_up() {
    let disk = SimDisk::new(35);
    disk.set_free_bytes(Some(100 << 20));
    let options = small_segments()
        .dedup_window(Duration::from_secs(600))
        .min_free_disk_bytes(32 << 20);
    let outbox =
        Outbox::open_with_storage("/outbox", options, Arc::new(disk.clone())).expect("open");
    append_and_ack(&outbox, "id", 20_000, 25, true);
    outbox.sync().expect("sync");
    let held = outbox.stats().held_for_ids;
    assert!(held > 0, "{:?}", outbox.stats());
    // The file system fills up from outside, below the floor.
    disk.set_free_bytes(Some(16 << 20));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match outbox.append(b"refused") {
            Err(Error::QuotaExceeded { quota, .. }) => assert_eq!(quota, "min_free_disk_bytes"),
            // Asked again at most every 10 ms: the first may still pass.
            Ok(_) => {}
            Err(e) => panic!("{e}"),
        }
        let stats = outbox.stats();
        if stats.held_for_ids < held {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "held segments kept while appends are refused: {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    outbox.close().expect("close");
}
