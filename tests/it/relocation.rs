//! One record never pins a segment: the few records nobody acknowledges (dead
//! letters, long delays, claims a stuck relay holds) are carried forward out
//! of the oldest segment, keeping their number, payload, state and attempts,
//! so that the segment and everything behind it can be deleted.

use std::time::Duration;

use segwal::{Error, Options, Outbox, Seq};

use crate::tmp;

const SEGMENT: u64 = 64 << 10;

fn options() -> Options {
    Options::default()
        .segment_bytes(SEGMENT)
        .lease(Duration::from_secs(3600))
}

fn payload(n: u64) -> Vec<u8> {
    format!("record {n:08} {}", "x".repeat(200)).into_bytes()
}

/// Appends `n` records in batches, claims and acknowledges every one but
/// those `keep` picks, which it hands to `park` while they are claimed.
fn churn(
    outbox: &Outbox,
    from: u64,
    n: u64,
    keep: impl Fn(u64) -> bool,
    mut park: impl FnMut(Seq),
) -> Vec<(Seq, u64)> {
    let mut kept = Vec::new();
    let mut k = from;
    while k < from + n {
        let batch: Vec<Vec<u8>> = (k..(k + 100).min(from + n)).map(payload).collect();
        let seqs = outbox.append_batch(&batch).expect("append_batch");
        for (i, _) in seqs.iter().enumerate() {
            let records = outbox.claim(1).expect("claim");
            let record = &records[0];
            let number = k + i as u64;
            assert_eq!(record.payload(), payload(number).as_slice());
            if keep(number) {
                kept.push((record.seq(), number));
                park(record.seq());
            } else {
                outbox.ack(record.seq()).expect("ack");
            }
        }
        k += batch.len() as u64;
    }
    outbox.sync().expect("sync");
    kept
}

/// [`churn`] of 3,000 records, those `keep` picks made dead letters
/// ("schema rejected").
fn churn_dead(outbox: &Outbox, keep: impl Fn(u64) -> bool) -> Vec<(Seq, u64)> {
    churn(outbox, 0, 3000, keep, |seq| {
        outbox
            .dead_letter(seq, "schema rejected")
            .expect("dead_letter");
    })
}

#[test]
fn a_dead_letter_is_carried_forward_and_stays_dead_across_restarts() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options()).expect("open");
    let dead = churn_dead(&outbox, |n| n == 5);
    let stats = outbox.stats();
    assert!(stats.relocated >= 1, "{stats:?}");
    assert!(
        stats.segments <= 4,
        "one dead letter keeps {} segments",
        stats.segments
    );
    assert_eq!(stats.dead_letters, 1);
    assert_eq!(
        stats.first_seq,
        Some(dead[0].0),
        "the oldest unacked is the dead letter"
    );
    // The copy counts as the record did (not its number and state): the
    // byte quota sees no more than before.
    let counted = payload(5).len() as u64;
    assert_eq!(stats.backlog_bytes, counted, "{stats:?}");
    let letters = outbox.dead_letters(10).expect("dead_letters");
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].seq(), dead[0].0);
    assert_eq!(letters[0].payload(), payload(5).as_slice());
    assert_eq!(letters[0].reason(), "schema rejected");
    outbox.close().expect("close");

    let outbox = Outbox::open(&dir, options()).expect("reopen");
    let stats = outbox.stats();
    assert_eq!((stats.dead_letters, stats.pending), (1, 0), "{stats:?}");
    assert_eq!(stats.backlog_bytes, counted, "after a reopen: {stats:?}");
    assert!(
        outbox.claim(10).expect("claim").is_empty(),
        "a dead letter is never claimed"
    );
    let letters = outbox.dead_letters(10).expect("dead_letters");
    assert_eq!((letters[0].seq(), letters[0].attempts()), (dead[0].0, 1));
    assert_eq!(letters[0].payload(), payload(5).as_slice());
    assert_eq!(letters[0].reason(), "schema rejected");
    // Requeued: delivered again under its own number, with its payload.
    outbox.requeue(dead[0].0).expect("requeue");
    let again = outbox.claim(10).expect("claim");
    assert_eq!(again.len(), 1);
    assert_eq!((again[0].seq(), again[0].attempt()), (dead[0].0, 1));
    assert_eq!(again[0].payload(), payload(5).as_slice());
    assert_eq!(outbox.stats().backlog_bytes, counted);
    outbox.ack(dead[0].0).expect("ack");
    assert_eq!(outbox.stats().backlog_bytes, 0);
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, options()).expect("reopen");
    assert!(outbox.claim(10).expect("claim").is_empty());
    assert_eq!(outbox.stats().dead_letters, 0);
    outbox.close().expect("close");
}

/// Parks one dead letter in `dir` ("schema rejected"), then writes `rounds`
/// rounds of five records, each claimed and acknowledged, opening the
/// outbox afresh for each round when `reopen` is set; returns the dead
/// letter's seq and the most segments seen on disk after a round.
fn one_dead_letter_then_rounds(
    dir: &std::path::Path,
    options: Options,
    rounds: u64,
    reopen: bool,
) -> (Seq, usize) {
    let mut outbox = Outbox::open(dir, options.clone()).expect("open");
    outbox.append(&payload(0)).expect("append");
    let parked = outbox.claim(1).expect("claim")[0].seq();
    outbox
        .dead_letter(parked, "schema rejected")
        .expect("dead_letter");
    let mut most = 0;
    for round in 0..rounds {
        if reopen {
            outbox.close().expect("close");
            outbox = Outbox::open(dir, options.clone()).expect("reopen");
        }
        let batch: Vec<Vec<u8>> = (0..5).map(|i| payload(1 + round * 5 + i)).collect();
        outbox.append_batch(&batch).expect("append_batch");
        let claimed = outbox.claim(10).expect("claim");
        assert_eq!(claimed.len(), 5, "round {round}");
        let seqs: Vec<Seq> = claimed.iter().map(|r| r.seq()).collect();
        outbox.ack_many(&seqs).expect("ack_many");
        outbox.sync().expect("sync");
        most = most.max(outbox.stats().segments);
    }
    let letters = outbox.dead_letters(10).expect("dead_letters");
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (letters[0].seq(), letters[0].payload(), letters[0].reason()),
        (parked, payload(0).as_slice(), "schema rejected")
    );
    outbox.close().expect("close");
    (parked, most)
}

/// The dead letter and nothing else is live at the end: a reopen finds it,
/// and nothing pending.
fn only_the_dead_letter_is_left(dir: &std::path::Path, options: Options, parked: Seq) {
    let outbox = Outbox::open(dir, options).expect("reopen");
    let stats = outbox.stats();
    assert_eq!((stats.dead_letters, stats.pending), (1, 0), "{stats:?}");
    assert_eq!(
        outbox.dead_letters(10).expect("dead_letters")[0].seq(),
        parked
    );
    outbox.close().expect("close");
}

/// Segments a few blocks long (a small `segment_bytes`, as a quiet outbox
/// rotating by age writes too): copying the one dead letter out of its
/// segment does not pay against that segment alone, but does against the
/// acknowledged segments behind it, which go with it. Before, no segment
/// was ever deleted again once one record was parked.
#[test]
fn a_dead_letter_in_a_small_segment_does_not_keep_the_later_ones() {
    let (_t, dir) = tmp();
    let options = options().segment_bytes(8 << 10);
    let (parked, most) = one_dead_letter_then_rounds(&dir, options.clone(), 200, false);
    assert!(most <= 16, "one dead letter kept {most} segments");
    only_the_dead_letter_is_left(&dir, options, parked);
}

/// An outbox opened afresh for each few records writes a small segment each
/// time. Their bytes stay within twice the live bytes plus two segments of
/// 1 MiB for a long while, but past [`CROWDED`] segments the dead letter is
/// carried forward anyway, so the files do not pile up.
#[test]
fn a_dead_letter_does_not_keep_more_than_a_crowd_of_small_segments() {
    const CROWDED: usize = 64;
    let (_t, dir) = tmp();
    let options = options().segment_bytes(1 << 20);
    let (parked, most) = one_dead_letter_then_rounds(&dir, options.clone(), 150, true);
    assert!(most <= CROWDED + 2, "one dead letter kept {most} segments");
    only_the_dead_letter_is_left(&dir, options, parked);
}

/// An outbox reopened with smaller segments finds its one dead letter due
/// to be carried forward (the log's bytes are now more than twice its live
/// bytes plus two segments): an idle outbox does it without waiting for a
/// request, and the segment the dead letter kept goes.
#[test]
fn an_idle_reopened_outbox_carries_its_dead_letter_forward() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options().segment_bytes(512 << 10)).expect("open");
    let dead = churn_dead(&outbox, |n| n == 5);
    let stats = outbox.stats();
    assert_eq!(
        (stats.relocated, stats.segments_deleted),
        (0, 0),
        "{stats:?}"
    );
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, options()).expect("reopen");
    crate::eventually("the dead letter carried forward, its segment gone", || {
        let stats = outbox.stats();
        stats.relocated >= 1 && stats.segments_deleted >= 1
    });
    let letters = outbox.dead_letters(10).expect("dead_letters");
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (letters[0].seq(), letters[0].payload()),
        (dead[0].0, payload(5).as_slice())
    );
    outbox.close().expect("close");
}

#[test]
fn a_delayed_record_is_carried_forward_and_waits_out_its_delay_after_a_restart() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options()).expect("open");
    let hour = Duration::from_secs(3600);
    let delayed = churn(
        &outbox,
        0,
        3000,
        |n| n == 7,
        |seq| {
            outbox
                .release_after(seq, hour, "rate limited")
                .expect("release_after");
        },
    );
    let stats = outbox.stats();
    assert!(stats.relocated >= 1, "{stats:?}");
    assert!(
        stats.segments <= 4,
        "one delay keeps {} segments",
        stats.segments
    );
    // Not due: nothing to claim, here or after a restart.
    assert!(outbox.claim(10).expect("claim").is_empty());
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, options()).expect("reopen");
    let stats = outbox.stats();
    assert_eq!((stats.delayed, stats.pending), (1, 0), "{stats:?}");
    assert!(outbox.claim(10).expect("claim").is_empty());
    assert_eq!(stats.first_seq, Some(delayed[0].0));
    outbox.close().expect("close");
}

#[test]
fn a_claim_held_by_a_stuck_relay_is_carried_forward_and_its_ack_still_counts() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options().lease(Duration::MAX)).expect("open");
    let held = churn(&outbox, 0, 3000, |n| n == 3, |_| {});
    let stats = outbox.stats();
    assert!(stats.relocated >= 1, "{stats:?}");
    assert!(
        stats.segments <= 4,
        "one claim keeps {} segments",
        stats.segments
    );
    assert_eq!(stats.claimed, 1);
    // Still held: extend and ack by its own number.
    outbox
        .extend(held[0].0, Duration::from_secs(60))
        .expect("extend");
    outbox.ack(held[0].0).expect("ack");
    assert!(matches!(
        outbox.ack(Seq::from(u64::MAX >> 3)),
        Err(Error::UnknownSeq { .. })
    ));
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, options()).expect("reopen");
    assert!(
        outbox.claim(10).expect("claim").is_empty(),
        "acknowledged before the close"
    );
    outbox.close().expect("close");
}

#[test]
fn a_claim_carried_forward_comes_back_after_a_crash_before_its_ack() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options().lease(Duration::MAX)).expect("open");
    let held = churn(&outbox, 0, 3000, |n| n == 3 || n == 1500, |_| {});
    assert!(outbox.stats().relocated >= 1);
    // The handle is dropped without close: its claims are gone, its records
    // are pending again, and the oldest comes first.
    drop(outbox);
    let outbox = Outbox::open(&dir, options()).expect("reopen");
    let back = outbox.claim(10).expect("claim");
    let got: Vec<(Seq, Vec<u8>)> = back
        .iter()
        .map(|r| (r.seq(), r.payload().to_vec()))
        .collect();
    assert_eq!(
        got,
        held.iter()
            .map(|&(s, n)| (s, payload(n)))
            .collect::<Vec<_>>()
    );
    // Attempts live in memory without `max_attempts`: both start again at
    // 1, the one carried forward while claimed too.
    let attempts: Vec<u32> = back.iter().map(|r| r.attempt()).collect();
    assert_eq!(attempts, [1, 1]);
    outbox.close().expect("close");
}

/// Under `max_attempts` the claim a crash interrupted counts, whether the
/// record was carried forward while claimed or not.
#[test]
fn under_max_attempts_an_interrupted_claim_counts_whether_carried_forward_or_not() {
    let (_t, dir) = tmp();
    let counted = || options().lease(Duration::MAX).max_attempts(5);
    let outbox = Outbox::open(&dir, counted()).expect("open");
    let held = churn(&outbox, 0, 3000, |n| n == 3 || n == 2990, |_| {});
    let relocated = outbox.stats().relocated;
    assert!(relocated >= 1);
    drop(outbox);
    let outbox = Outbox::open(&dir, counted()).expect("reopen");
    let back: Vec<(Seq, u32)> = outbox
        .claim(10)
        .expect("claim")
        .iter()
        .map(|r| (r.seq(), r.attempt()))
        .collect();
    assert_eq!(back, [(held[0].0, 2), (held[1].0, 2)]);
    outbox.close().expect("close");
}

/// A lossy repair that drops the only copy of a record carried forward out
/// of a deleted segment names it: its number lies below every number the
/// repair reports as a range. Damage to records around the copy (each on a
/// copy of the outbox; never to the copy itself, whose damaged bytes could
/// not name it): the carried record is named exactly when it is gone, and
/// damage before it drops it.
#[test]
fn a_lossy_repair_names_a_relocated_record_it_drops() {
    // The copy is the log's first record when the segment it was written to
    // rotated just before it and became the oldest: nothing before it to
    // damage. The outbox is built again then (up to four times).
    let mut built = None;
    for _ in 0..4 {
        let (t, dir) = tmp();
        let outbox = Outbox::open(&dir, options()).expect("open");
        let dead = churn_dead(&outbox, |n| n == 5 || n == 2990);
        assert!(outbox.stats().relocated >= 1);
        // Records nobody acknowledges yet, after the copy.
        let batch: Vec<Vec<u8>> = (3000..3800).map(payload).collect();
        outbox.append_batch(&batch).expect("append_batch");
        outbox.close().expect("close");
        let carried = dead[0].0;
        // Every record's frame, in log order (segment files are named by
        // their first number), and the carried record's copy among them.
        let mut frames: Vec<(std::path::PathBuf, u64, Seq)> =
            segwal::dump(&dir, segwal::DumpOptions::new())
                .expect("dump")
                .map(|r| {
                    let r = r.expect("record");
                    let name = r.path.file_name().expect("name").into();
                    (name, r.offset, r.seq)
                })
                .collect();
        frames.sort();
        let at = frames
            .iter()
            .position(|f| f.2 == carried)
            .expect("the carried record's copy");
        if at > 0 {
            built = Some((t, dir, dead, carried, frames, at));
            break;
        }
    }
    let (t, dir, dead, carried, frames, at) =
        built.expect("a record before the carried record's copy, in one of four runs");
    let first_of = |name: &std::path::Path| -> u64 {
        name.to_str().expect("name")[..20].parse().expect("numeric")
    };
    assert!(
        first_of(&frames[at].0) > carried.get(),
        "the carried record's own segment is gone"
    );
    // The record just before the copy and just after it (if the copy is not
    // the log's last record), and the first record of every segment.
    let mut victims: Vec<usize> = [at - 1, at + 1]
        .into_iter()
        .filter(|&k| k < frames.len())
        .collect();
    for (k, f) in frames.iter().enumerate() {
        if k != at && frames.iter().position(|g| g.0 == f.0) == Some(k) {
            victims.push(k);
        }
    }
    victims.sort_unstable();
    victims.dedup();
    let mut named = 0;
    for (n, &v) in victims.iter().enumerate() {
        let (name, offset, _) = &frames[v];
        let copy = t.path().join(format!("copy-{n}"));
        std::fs::create_dir(&copy).expect("mkdir");
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let path = entry.expect("entry").path();
            if path.is_file() {
                std::fs::copy(&path, copy.join(path.file_name().expect("name"))).expect("copy");
            }
        }
        crate::flip_byte(&copy.join(name), offset + 48 + 1);
        let strict = options().open_check(segwal::OpenCheck::EveryFrame);
        match Outbox::open(&copy, strict.clone()) {
            Err(Error::Corrupt { .. }) => {}
            // In the newest segment's last batch: a torn tail, cut (the
            // documented limit), and no repair.
            Ok(outbox) if frames[v].0 == frames.last().expect("frames").0 => {
                assert!(outbox.recovery_report().torn_tail.is_some());
                outbox.close().expect("close");
                continue;
            }
            other => panic!("damage to frame {v}: {other:?}"),
        }
        let lossy = strict.recovery(segwal::RecoveryMode::Lossy);
        let outbox = Outbox::open(&copy, lossy).expect("repair");
        let dropped = outbox.recovery_report().dropped.clone().expect("dropped");
        assert!(dropped.first >= Seq::from(first_of(name)));
        // The dead letter still in its own segment is numbered within the
        // range, never named apart.
        assert!(dropped.last.is_some_and(|l| l >= dead[1].0));
        let left: Vec<Seq> = outbox
            .dead_letters(10)
            .expect("dead_letters")
            .iter()
            .map(|r| r.seq())
            .collect();
        let gone = !left.contains(&carried);
        assert_eq!(
            dropped.relocated,
            if gone { vec![carried] } else { vec![] },
            "damage to frame {v} ({name:?} at {offset}), the copy frame {at}: gone {gone}, left {left:?}"
        );
        // Damage before the copy drops it; damage in a later segment keeps
        // it (in its own segment after it, the copy goes only with the
        // damaged batch).
        if v < at {
            assert!(gone, "damage to frame {v}, before the copy, dropped it");
        } else if frames[v].0 != frames[at].0 {
            assert!(!gone, "damage to frame {v}, in a later segment, kept it");
        }
        named += usize::from(gone);
        outbox.close().expect("close");
    }
    assert!(named >= 1, "damage before the copy drops the record");
}

/// The test: one record in 10,000 left unacknowledged (dead or
/// delayed) for the whole run of 2 M appends; disk use stays under three
/// times the live bytes plus two segments.
#[test]
fn disk_use_stays_bounded_by_the_live_records() {
    let (_t, dir) = tmp();
    let segment = 256 << 10;
    let outbox = Outbox::open(&dir, options().segment_bytes(segment)).expect("open");
    let total = 2_000_000u64;
    let mut parked = 0u64;
    let mut worst = 0.0f64;
    let mut n = 0u64;
    while n < total {
        let batch: Vec<[u8; 24]> = (n..n + 2000)
            .map(|k| {
                let mut p = [b'.'; 24];
                p[..8].copy_from_slice(&k.to_le_bytes());
                p
            })
            .collect();
        outbox.append_batch(&batch).expect("append_batch");
        loop {
            let records = outbox.claim(1000).expect("claim");
            if records.is_empty() {
                break;
            }
            let mut done = Vec::with_capacity(records.len());
            for r in &records {
                let k = u64::from_le_bytes(r.payload()[..8].try_into().expect("8 bytes"));
                if k % 10_000 == 0 {
                    parked += 1;
                    if k % 20_000 == 0 {
                        outbox.dead_letter(r.seq(), "refused").expect("dead_letter");
                    } else {
                        outbox
                            .release_after(r.seq(), Duration::from_secs(3600), "later")
                            .expect("release_after");
                    }
                } else {
                    done.push(r.seq());
                }
            }
            outbox.ack_many(&done).expect("ack_many");
        }
        outbox.sync().expect("sync");
        let stats = outbox.stats();
        // Live bytes: the frames of the records not acknowledged (48-byte
        // header and payload), what they take in the log.
        let live = stats.backlog_bytes + 48 * (stats.pending + stats.claimed + parked);
        let bound = 3 * live + 2 * segment;
        assert!(
            stats.disk_bytes <= bound,
            "after {} appends: {} bytes on disk, bound {bound} ({stats:?})",
            n + 2000,
            stats.disk_bytes
        );
        worst = worst.max(stats.disk_bytes as f64 / bound as f64);
        n += 2000;
    }
    let stats = outbox.stats();
    assert_eq!(stats.dead_letters + stats.delayed, parked);
    assert_eq!(parked, total / 10_000);
    assert!(stats.relocated > 0);
    eprintln!(
        "2 M appends, {parked} parked: {} segments, {} bytes on disk at the end, worst {:.2} of the bound, {} relocated",
        stats.segments, stats.disk_bytes, worst, stats.relocated
    );
    outbox.close().expect("close");
    // Every parked record survives, with its state.
    let outbox = Outbox::open(&dir, options().segment_bytes(segment)).expect("reopen");
    let stats = outbox.stats();
    assert_eq!(
        (stats.dead_letters, stats.delayed, stats.pending),
        (parked / 2, parked / 2, 0)
    );
    outbox.close().expect("close");
}

/// Carried forward and reopened without `max_attempts` (attempts forgotten),
/// a record released with a delay and no reason is still one that was
/// handed out: it keeps its key's turn ahead of an older record requeued
/// meanwhile, and its acknowledgement is accepted; a record waiting for its
/// own not-before time, carried forward too, still waits for it and was
/// never handed out (`NotClaimed`).
#[test]
fn delays_carried_forward_keep_what_they_are_across_restarts() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, options()).expect("open");
    let keyed = |p: &[u8]| {
        outbox
            .append_message(&segwal::Message::new(p).key(b"k"))
            .expect("append")
            .seq
    };
    let (older, released) = (keyed(b"older"), keyed(b"released"));
    let waiting = outbox
        .append_message(&segwal::Message::new(b"waiting").delay(Duration::from_secs(3600)))
        .expect("append")
        .seq;
    assert_eq!(outbox.claim(10).expect("claim")[0].seq(), older);
    outbox.dead_letter(older, "refused").expect("dead letter");
    assert_eq!(outbox.claim(10).expect("claim")[0].seq(), released);
    outbox
        .release_after(released, Duration::from_secs(3600), "")
        .expect("release_after");
    outbox
        .requeue(older)
        .expect("requeue: behind the delayed record");
    churn(&outbox, 0, 3000, |_| false, |_| {});
    let stats = outbox.stats();
    assert!(stats.relocated >= 3, "{stats:?}");
    outbox.close().expect("close");
    for reopen in 0..2 {
        let outbox = Outbox::open(&dir, options()).expect("reopen");
        let stats = outbox.stats();
        assert_eq!(
            (stats.delayed, stats.held_by_key),
            (2, 1),
            "reopen {reopen}: {stats:?}"
        );
        assert!(
            outbox.claim(10).expect("claim").is_empty(),
            "reopen {reopen}"
        );
        match outbox.ack(waiting) {
            Err(Error::NotClaimed { seq }) => assert_eq!(seq, waiting),
            other => panic!("reopen {reopen}: ack of a record never handed out: {other:?}"),
        }
        if reopen == 0 {
            // Carried forward again, by a life that forgot every attempt.
            churn(&outbox, 3000, 3000, |_| false, |_| {});
            outbox.close().expect("close");
            continue;
        }
        outbox
            .ack(released)
            .expect("ack of a record released with a delay");
        assert_eq!(outbox.claim(10).expect("claim")[0].seq(), older);
        outbox.ack(older).expect("ack");
        outbox.close().expect("close");
    }
}
