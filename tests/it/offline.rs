//! The offline tools (`verify`, `dump`) on a log the running owner changes
//! while they read it.

use segwal::sim::harness;

/// A segment file cut between the tools' measure of its length and their
/// read (the owner's seal cuts the space reserved after it) ends early: both
/// tools read it again at its new length, and find the log whole. (Seen live
/// as a dump failing with "file ended before the expected bytes", about one
/// run in forty of `dump_while_the_owner_appends_stops_at_what_was_written`.)
#[test]
fn verify_and_dump_read_again_a_file_cut_while_they_read_it() {
    let (verified, dumped) = harness::offline_tools_on_files_cut_under_them();
    assert_eq!(verified, Ok(true), "verify: clean");
    assert_eq!(dumped, Ok(40), "dump: every record");
}

/// A log that rotates faster than `verify` reads it: the newest file listed
/// may be sealed by the time it is read, its successor created after the
/// listing. That is growth, not a missing segment: each pass follows the
/// chain to the files created since it listed the directory. (Before, a
/// check of an outbox appending in batches to small segments reported
/// "missing segment" in about half its runs: every pass found a different
/// one, and the last was reported.)
#[test]
fn verify_follows_a_log_that_rotates_while_it_reads() {
    assert_eq!(
        harness::verify_on_a_log_that_grows_between_listings(),
        Ok(true)
    );
}

/// `verify`'s record count includes the records only a relocated copy still
/// holds: an outbox whose every live record was carried forward out of its
/// deleted segment does not read as holding none.
#[test]
fn verify_counts_the_records_only_a_relocated_copy_holds() {
    let (_t, dir) = crate::tmp();
    let outbox = segwal::Outbox::open(
        &dir,
        segwal::Options::default()
            .segment_bytes(64 << 10)
            .max_attempts(5),
    )
    .expect("open");
    for i in 0..300u32 {
        let payload = format!("{{\"order\": {i}, \"pad\": \"{}\"}}", "y".repeat(400));
        outbox.append(payload.as_bytes()).expect("append");
    }
    outbox.append(b"refused").expect("append");
    let first = outbox.claim(200).expect("claim");
    outbox
        .ack_through(first.last().expect("records").seq())
        .expect("ack_through");
    for r in outbox.claim(1000).expect("claim") {
        if r.payload() == b"refused" {
            outbox.dead_letter(r.seq(), "refused").expect("dead letter");
        } else {
            outbox.release(r.seq()).expect("release");
        }
    }
    let relocated = outbox.stats().relocated;
    outbox.close().expect("close");
    let found = segwal::verify(&dir).expect("verify");
    let states = found.states.expect("states");
    assert!(states.pending + states.dead >= 101, "{states:?}");
    assert_eq!(found.records, states.records, "relocated {relocated}");
}
