//! Leases: a claim holds its records for a while, then lets them go; each
//! delivery of a record has a number.

use std::thread::sleep;
use std::time::{Duration, Instant};

use segwal::{Error, Message, Options, Outbox, Seq};

use crate::tmp;

/// Long enough that the calls between a claim and the checks after it fit
/// in it on a loaded machine.
const LEASE: Duration = Duration::from_millis(400);
/// Comfortably past a lease.
const PAST: Duration = Duration::from_millis(1_000);

fn open(lease: Duration) -> (tempfile::TempDir, Outbox) {
    let (t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default().lease(lease)).expect("open");
    (t, outbox)
}

#[test]
fn an_expired_claim_comes_back_first_as_a_new_attempt() {
    let (_t, outbox) = open(LEASE);
    let seqs: Vec<Seq> = (0..5u8)
        .map(|i| outbox.append(&[i]).expect("append"))
        .collect();
    let first = outbox.claim(2).expect("claim");
    assert_eq!(
        first.iter().map(|r| r.attempt()).collect::<Vec<_>>(),
        [1, 1]
    );
    // The relay holding them dies; the lease runs out.
    sleep(PAST);
    let again = outbox.claim(3).expect("claim");
    let got: Vec<(Seq, u32)> = again.iter().map(|r| (r.seq(), r.attempt())).collect();
    assert_eq!(got, [(seqs[0], 2), (seqs[1], 2), (seqs[2], 1)]);
    assert_eq!(outbox.stats().claimed_expired, 2);
    // A late acknowledgement of the first delivery is accepted: the record was
    // delivered. It is done, and the new delivery's ack is a no-op.
    outbox.ack(seqs[0]).expect("late ack");
    outbox.ack(seqs[0]).expect("ack of the new delivery");
    outbox.close().expect("close");
}

#[test]
fn extend_keeps_a_claim_and_fails_once_the_lease_ran_out() {
    let (_t, outbox) = open(LEASE);
    let a = outbox.append(b"a").expect("append");
    let b = outbox.append(b"b").expect("append");
    let held = outbox.claim(2).expect("claim");
    assert_eq!(held.len(), 2);
    // Renew `a` for a long time; let `b` run out.
    outbox.extend(a, Duration::from_secs(3600)).expect("extend");
    sleep(PAST);
    let back = outbox.claim(10).expect("claim");
    assert_eq!(back.iter().map(|r| r.seq()).collect::<Vec<_>>(), [b]);
    assert_eq!(back[0].attempt(), 2);
    assert_eq!(outbox.stats().claimed, 2, "a still held, b held again");
    // `b`'s old delivery is gone: extending it now extends the new one.
    outbox
        .extend(b, Duration::from_secs(3600))
        .expect("extend the new delivery");
    // Not claimed at all: refused.
    let c = outbox.append(b"c").expect("append");
    assert!(matches!(
        outbox.extend(c, LEASE),
        Err(Error::NotClaimed { seq }) if seq == c
    ));
    outbox.ack_many(&[a, b]).expect("ack");
    assert!(matches!(
        outbox.extend(a, LEASE),
        Err(Error::NotClaimed { .. })
    ));
    outbox.close().expect("close");
}

#[test]
fn a_released_record_comes_back_as_its_next_attempt() {
    let (_t, outbox) = open(Duration::from_secs(3600));
    let s = outbox.append(b"x").expect("append");
    for attempt in 1..=3 {
        let got = outbox.claim(1).expect("claim");
        assert_eq!((got[0].seq(), got[0].attempt()), (s, attempt));
        outbox.release(s).expect("release");
    }
    outbox.close().expect("close");
}

#[test]
fn a_waiting_relay_is_woken_when_a_lease_runs_out() {
    let (_t, outbox) = open(LEASE);
    let s = outbox.append(b"x").expect("append");
    assert_eq!(outbox.claim(1).expect("claim").len(), 1);
    // Nothing pending: the wait ends when the lease runs out and the record
    // comes back, well before the timeout.
    let got = outbox
        .claim_wait(1, Duration::from_secs(3600))
        .expect("claim_wait");
    assert_eq!((got[0].seq(), got[0].attempt()), (s, 2));
    outbox.close().expect("close");
}

#[test]
fn leases_can_be_disabled() {
    let (_t, outbox) = open(Duration::MAX);
    outbox.append(b"x").expect("append");
    assert_eq!(outbox.claim(1).expect("claim").len(), 1);
    sleep(PAST);
    assert!(outbox.claim(1).expect("claim").is_empty());
    assert_eq!(outbox.stats().claimed_expired, 0);
    assert_eq!(outbox.stats().claimed, 1);
    outbox.close().expect("close");
}

/// `extend` by zero ends the lease at once: the record is handed out again
/// at the next claim, as an expiry.
#[test]
fn extend_by_zero_lets_the_record_go_as_an_expiry() {
    let (_t, outbox) = open(Duration::from_secs(3600));
    let seq = outbox.append(b"x").expect("append");
    assert_eq!(outbox.claim(1).expect("claim")[0].seq(), seq);
    outbox.extend(seq, Duration::ZERO).expect("extend by zero");
    sleep(Duration::from_millis(2));
    let again = outbox.claim(1).expect("claim");
    assert_eq!((again[0].seq(), again[0].attempt()), (seq, 2));
    assert_eq!(outbox.stats().claimed_expired, 1);
    outbox.ack(seq).expect("ack");
    outbox.close().expect("close");
}

/// A lease cut shorter wakes those waiting for records: `claim_wait` and
/// `claim_wait_async` get the record then, not when the old lease would have
/// ended (an hour here; their timeout is a minute).
#[test]
fn a_lease_cut_short_wakes_the_waiting_claims() {
    let (_t, outbox) = open(Duration::from_secs(3600));
    for asynchronous in [false, true] {
        let seq = outbox.append(b"x").expect("append");
        assert_eq!(outbox.claim(1).expect("claim")[0].seq(), seq);
        let waiter = {
            let outbox = outbox.clone();
            std::thread::spawn(move || {
                let timeout = Duration::from_secs(60);
                if asynchronous {
                    pollster::block_on(outbox.claim_wait_async(1, timeout))
                } else {
                    outbox.claim_wait(1, timeout)
                }
            })
        };
        // Give the waiter time to sleep on the lease's end (if it has not,
        // it finds the record claimable when it looks).
        sleep(Duration::from_millis(200));
        outbox.extend(seq, Duration::ZERO).expect("extend by zero");
        let got = waiter.join().expect("waiter").expect("claim_wait");
        assert_eq!(got.len(), 1, "async: {asynchronous}");
        assert_eq!((got[0].seq(), got[0].attempt()), (seq, 2));
        outbox.ack(seq).expect("ack");
    }
    outbox.close().expect("close");
}

/// The settling calls that take a `Record` act only on the delivery that
/// handed it out: once its lease ran out and another claim took the record,
/// a late `release_record`, `dead_letter_record` or `extend_record` is
/// `NotClaimed` and the other claim keeps the record, its key's next
/// record still waiting behind it.
#[test]
fn a_late_settling_of_a_record_leaves_the_claim_that_holds_it_now() {
    let (_t, dir) = tmp();
    let outbox =
        Outbox::open(&dir, Options::default().lease(Duration::from_millis(50))).expect("open");
    let first = outbox
        .append_message(&Message::new(b"first").key(b"k"))
        .expect("append")
        .seq;
    outbox
        .append_message(&Message::new(b"second").key(b"k"))
        .expect("append");
    let late = outbox.claim(1).expect("claim").remove(0);
    assert_eq!(late.seq(), first);
    let deadline = Instant::now() + Duration::from_secs(10);
    let now = loop {
        std::thread::sleep(Duration::from_millis(60));
        let again = outbox.claim(1).expect("claim");
        if let Some(record) = again.into_iter().next() {
            break record;
        }
        assert!(Instant::now() < deadline, "the lease never ran out");
    };
    assert_eq!((now.seq(), now.attempt()), (first, 2));
    outbox
        .extend_record(&now, Duration::from_secs(3600))
        .expect("the holder renews");
    let refused =
        |r: segwal::Result<()>| matches!(r, Err(Error::NotClaimed { seq }) if seq == first);
    assert!(refused(outbox.release_record(
        &late,
        Duration::ZERO,
        "late"
    )));
    assert!(refused(outbox.dead_letter_record(&late, "late")));
    assert!(refused(outbox.extend_record(&late, Duration::ZERO)));
    let stats = outbox.stats();
    assert_eq!((stats.claimed, stats.dead_letters), (1, 0), "{stats:?}");
    assert!(
        outbox.claim(10).expect("claim").is_empty(),
        "nothing of the key goes out while the holder publishes"
    );
    // The holder's own settling works, and frees the key.
    outbox
        .release_record(&now, Duration::ZERO, "try again")
        .expect("release_record");
    let third = outbox.claim(1).expect("claim").remove(0);
    assert_eq!((third.seq(), third.attempt()), (first, 3));
    assert_eq!(third.last_error(), Some("try again"));
    outbox
        .dead_letter_record(&third, "refused")
        .expect("dead_letter_record");
    let next = outbox.claim(10).expect("claim");
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].payload(), b"second");
    outbox.close().expect("close");
}

/// One `ack_many` that passes the turns of several keys wakes as many
/// relays waiting in `claim_wait`: each takes one key's next record, none
/// sleeps on to its timeout while a record waits for it. (The writer's
/// own wake-ups are kept out of the way: acknowledgements are written at
/// most once an hour.)
#[test]
fn acknowledging_several_keys_at_once_wakes_a_waiting_relay_for_each() {
    const KEYS: usize = 4;
    let (_t, dir) = tmp();
    let options = Options::default().buffered_sync_interval(Duration::from_secs(3600));
    let outbox = Outbox::open(&dir, options).expect("open");
    for round in 0..2 {
        for k in 0..KEYS {
            let body = format!("key {k} record {round}");
            let key = format!("k{k}");
            outbox
                .append_message(&Message::new(body.as_bytes()).key(key.as_bytes()))
                .expect("append");
        }
    }
    let firsts = outbox.claim(KEYS * 2).expect("claim");
    assert_eq!(firsts.len(), KEYS, "one record a key is out");
    let waiters: Vec<_> = (0..KEYS)
        .map(|_| {
            let outbox = outbox.clone();
            std::thread::spawn(move || outbox.claim_wait(1, Duration::from_secs(20)))
        })
        .collect();
    // Until every waiter sleeps (a waiter that has not started yet finds
    // its record at once, which proves nothing but fails nothing).
    sleep(Duration::from_millis(200));
    let seqs: Vec<Seq> = firsts.iter().map(|r| r.seq()).collect();
    outbox.ack_many(&seqs).expect("ack_many");
    let mut got = 0;
    for waiter in waiters {
        got += waiter.join().expect("waiter").expect("claim_wait").len();
    }
    assert_eq!(got, KEYS, "some waiters slept to their timeout");
    outbox.close().expect("close");
}

/// A `Record` names the opening whose claim handed it out: one from before
/// a reopen, or from another outbox, whose claim numbers start afresh too,
/// settles nothing here.
#[test]
fn a_record_of_an_earlier_opening_or_another_outbox_settles_nothing() {
    let (_t, dir) = tmp();
    let (_u, elsewhere) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    outbox.append(b"kept").expect("append");
    let stale = outbox.claim(1).expect("claim").remove(0);
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, Options::default()).expect("reopen");
    let fresh = outbox.claim(1).expect("claim").remove(0);
    assert_eq!((fresh.seq(), fresh.attempt()), (stale.seq(), 1));
    let other = Outbox::open(&elsewhere, Options::default()).expect("open another");
    other.append(b"another's").expect("append");
    let foreign = other.claim(1).expect("claim").remove(0);
    assert_eq!(foreign.seq(), fresh.seq(), "the same number in both");
    for record in [&stale, &foreign] {
        let refused = |r: segwal::Result<()>| matches!(r, Err(Error::NotClaimed { .. }));
        assert!(refused(outbox.release_record(record, Duration::ZERO, "x")));
        assert!(refused(outbox.dead_letter_record(record, "x")));
        assert!(refused(outbox.extend_record(record, Duration::ZERO)));
    }
    let stats = outbox.stats();
    assert_eq!((stats.claimed, stats.dead_letters), (1, 0), "{stats:?}");
    outbox
        .dead_letter_record(&fresh, "refused")
        .expect("the holder's own");
    assert_eq!(outbox.stats().dead_letters, 1);
    other.close().expect("close");
    outbox.close().expect("close");
    // Closed, an outbox answers `Closed`, whoever's record it is given.
    assert!(matches!(
        outbox.release_record(&foreign, Duration::ZERO, "x"),
        Err(Error::Closed)
    ));
}
