//! Claims, releases and acknowledgements, and the blocking claim.

use std::thread;
use std::time::Duration;

use segwal::{Error, Options, Outbox, Seq};

use crate::{drain, small_segments, tmp};

fn seqs(records: &[segwal::Record]) -> Vec<u64> {
    records.iter().map(|r| r.seq().get()).collect()
}

#[test]
fn claims_hand_out_oldest_first_and_released_records_come_back_first() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let appended: Vec<u64> = (0..10)
        .map(|i| {
            outbox
                .append(format!("r{i}").as_bytes())
                .expect("append")
                .get()
        })
        .collect();
    let first = outbox.claim(4).expect("claim");
    assert_eq!(seqs(&first), appended[..4]);
    assert_eq!(first[2].payload(), b"r2");
    outbox.release(first[1].seq()).expect("release");
    outbox.release(first[3].seq()).expect("release");
    let second = outbox.claim(3).expect("claim");
    assert_eq!(
        seqs(&second),
        vec![appended[1], appended[3], appended[4]],
        "released records before newer ones"
    );
    let stats = outbox.stats();
    assert_eq!((stats.pending, stats.claimed), (5, 5));
    assert_eq!(stats.first_seq, Some(Seq::from(appended[0])));
}

#[test]
fn ack_and_release_errors_name_the_seq() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let a = outbox.append(b"a").expect("append");
    let b = outbox.append(b"b").expect("append");
    assert!(matches!(outbox.ack(a), Err(Error::NotClaimed { seq }) if seq == a));
    assert!(matches!(outbox.release(a), Err(Error::NotClaimed { seq }) if seq == a));
    let never = Seq::from(b.get() + 1000);
    assert!(matches!(outbox.ack(never), Err(Error::UnknownSeq { seq }) if seq == never));
    let claimed = outbox.claim(2).expect("claim");
    assert_eq!(claimed.len(), 2);
    // ack_many is all or nothing.
    assert!(outbox.ack_many(&[a, never]).is_err());
    assert_eq!(outbox.stats().claimed, 2);
    outbox.ack_many(&[a, b]).expect("ack both");
    // An acknowledged record can be acknowledged again, but not released.
    outbox.ack(a).expect("repeated ack is fine");
    assert!(matches!(outbox.release(a), Err(Error::NotClaimed { .. })));
    let stats = outbox.stats();
    assert_eq!(
        (stats.pending, stats.claimed, stats.backlog_bytes),
        (0, 0, 0)
    );
    assert_eq!(stats.first_seq, None);
}

#[test]
fn claim_bytes_bounds_the_payload_total_but_always_makes_progress() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    for _ in 0..5 {
        outbox.append(&[7u8; 100]).expect("append");
    }
    assert_eq!(outbox.claim_bytes(10, 250).expect("claim").len(), 2);
    assert_eq!(outbox.claim_bytes(10, 1).expect("claim").len(), 1);
    assert_eq!(outbox.claim_bytes(1, 10_000).expect("claim").len(), 1);
    assert_eq!(outbox.claim_bytes(10, 10_000).expect("claim").len(), 1);
    assert!(outbox.claim(10).expect("claim").is_empty());
}

#[test]
fn claim_wait_is_woken_by_the_writer_and_times_out_empty() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    assert!(
        outbox
            .claim_wait(10, Duration::from_millis(30))
            .expect("claim")
            .is_empty()
    );
    let relay = {
        let outbox = outbox.clone();
        // A long timeout: the test passes only if the append wakes the relay.
        thread::spawn(move || outbox.claim_wait(10, Duration::from_secs(600)))
    };
    thread::sleep(Duration::from_millis(20));
    let seq = outbox.append(b"wake up").expect("append");
    let got = relay.join().expect("relay").expect("claim");
    assert_eq!(seqs(&got), vec![seq.get()]);
}

#[test]
fn close_wakes_a_waiting_relay() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let relay = {
        let outbox = outbox.clone();
        thread::spawn(move || outbox.claim_wait(10, Duration::from_secs(600)))
    };
    thread::sleep(Duration::from_millis(20));
    outbox.close().expect("close");
    assert!(matches!(relay.join().expect("relay"), Err(Error::Closed)));
}

#[test]
fn unacknowledged_records_are_handed_out_again_after_reopen() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    let all: Vec<Seq> = (0..200)
        .map(|i| outbox.append(&[i as u8; 50]).expect("append"))
        .collect();
    let claimed = outbox.claim(150).expect("claim");
    // Acknowledge the first 100, leave 50 claimed and 50 never claimed.
    let acked: Vec<Seq> = claimed[..100].iter().map(|r| r.seq()).collect();
    outbox.ack_many(&acked).expect("ack");
    outbox.sync().expect("barrier: deletions done");
    outbox.close().expect("close");

    let outbox = Outbox::open(&dir, small_segments()).expect("reopen");
    let again = drain(&outbox);
    let again: Vec<Seq> = again.iter().map(|r| r.seq()).collect();
    // Everything not acknowledged is back, in order, and nothing acknowledged:
    // the acknowledgements were written to the log and fsynced at the close.
    assert_eq!(again, all[100..].to_vec());
    assert_eq!(
        outbox.recovery_report().records_recovered,
        again.len() as u64
    );
}

#[test]
fn one_corrupt_record_fails_one_claim_and_does_not_wedge_the_queue() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    for i in 0..100u8 {
        outbox.append(&[i; 100]).expect("append");
    }
    // Damage the payload of the first record of the first (sealed, mapped)
    // segment behind the outbox's back: at rest, after recovery checked it.
    let first = crate::segment_files(&dir)[0].clone();
    // Its frame starts the block after the header's; its payload, the frame's
    // 48-byte header on.
    let frame_at = 4096;
    crate::flip_byte(&first, (frame_at + 48 + 10) as u64);

    match outbox.claim(10) {
        Err(Error::Corrupt {
            path, offset, seq, ..
        }) => {
            assert_eq!(path, first);
            assert_eq!(offset, frame_at as u64);
            assert_eq!(seq, Some(Seq::from(1)));
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    let next = outbox.claim(10).expect("the queue moves on");
    assert_eq!(seqs(&next), (2..=11).collect::<Vec<_>>());
    assert_eq!(outbox.stats().corrupt_records, 1);
}

#[test]
fn claiming_one_record_at_a_time_crosses_segment_boundaries() {
    // Regression: sequence numbers skip the seal frame between two segments; a
    // claim that ended on a segment's last record left the cursor in that gap and
    // every later claim came back empty while records were pending.
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    let appended: Vec<u64> = (0..100)
        .map(|i| outbox.append(&[i as u8; 100]).expect("append").get())
        .collect();
    assert!(outbox.stats().segments > 2);
    let mut claimed = Vec::new();
    loop {
        let got = outbox.claim(1).expect("claim");
        let Some(record) = got.first() else { break };
        claimed.push(record.seq().get());
    }
    assert_eq!(claimed, appended);
}

/// Regression: sealed segments were read through a memory map, and a segment
/// file cut short underneath a running outbox killed the process with SIGBUS at
/// the next claim. Now the claim fails with `Corrupt` naming the file and
/// offset, the record is set aside, and the others keep flowing.
#[test]
fn a_segment_cut_short_underneath_fails_one_claim_and_the_rest_flows() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    let seqs: Vec<Seq> = (0..40u8)
        .map(|i| outbox.append(&[i; 100]).expect("append"))
        .collect();
    let first = crate::segment_files(&dir)[0].clone();
    // Cut inside the fourth record's frame.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&first)
        .expect("open");
    file.set_len(4 * 4096 + 10).expect("cut");
    drop(file);
    let mut delivered = Vec::new();
    let mut refused = Vec::new();
    loop {
        match outbox.claim(5) {
            Ok(records) if records.is_empty() => break,
            Ok(records) => {
                for r in records {
                    delivered.push(r.seq());
                    outbox.ack(r.seq()).expect("ack");
                }
            }
            Err(Error::Corrupt { path, offset, .. }) => {
                assert_eq!(path, first);
                refused.push(offset);
            }
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    // Every record whose bytes are gone is refused, naming where; every other
    // record is delivered, in order.
    assert!(!refused.is_empty());
    assert!(refused.iter().all(|&o| o >= 4 * 4096), "{refused:?}");
    assert!(delivered.starts_with(&seqs[..3]), "{delivered:?}");
    assert!(delivered.ends_with(&seqs[15..]), "the later segments flow");
    assert_eq!(delivered.len() + refused.len(), seqs.len());
}
