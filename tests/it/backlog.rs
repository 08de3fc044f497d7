//! A backlog of thousands of segments (a long outage of the far side) needs no
//! more file descriptors than a few: the outbox keeps appending, reopens and
//! drains it under a limit of 64 descriptors.

use std::process::Command;

use segwal::{Options, Outbox, SEGMENT_BYTES_MIN, Seq};

use crate::tmp;

/// Set in the environment of the child process, which runs under the limit.
const CHILD_DIR: &str = "SEGWAL_TEST_BACKLOG_CHILD_DIR";
const SEGMENTS: usize = 5_000;

/// Regression: every live segment kept its descriptor (and its memory map),
/// and recovery opened them all at once, so that about a thousand
/// unacknowledged segments made rotation fail with EMFILE and poison the
/// outbox, and the reopen failed too.
#[test]
fn five_thousand_unacknowledged_segments_under_64_descriptors() {
    let (_t, dir) = tmp();
    let status = Command::new(crate::this_binary())
        .args([
            "--exact",
            "backlog::child_with_64_descriptors",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, &dir)
        .status()
        .expect("spawn child");
    assert!(status.success(), "the child failed under the limit");
}

/// The child half: without its environment variable (an ordinary test run) it
/// has nothing to do.
#[test]
fn child_with_64_descriptors() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let limit = libc::rlimit {
        rlim_cur: 64,
        rlim_max: 64,
    };
    // SAFETY: setrlimit with a valid, initialised struct; lowering a limit of
    // this process only.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) };
    assert_eq!(rc, 0, "setrlimit");
    // One write batch per segment: each append rotates.
    let options = Options::default()
        .segment_bytes(SEGMENT_BYTES_MIN)
        .durability(segwal::Durability::Buffered);
    let outbox = Outbox::open(&dir, options.clone()).expect("open");
    let seqs: Vec<Seq> = (0..SEGMENTS as u32)
        .map(|i| {
            outbox
                .append(&i.to_le_bytes())
                .expect("append under the limit")
        })
        .collect();
    assert!(outbox.stats().segments >= SEGMENTS);
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, options).expect("reopen under the limit");
    let mut got = Vec::with_capacity(SEGMENTS);
    loop {
        let records = outbox.claim(512).expect("claim under the limit");
        if records.is_empty() {
            break;
        }
        for r in &records {
            assert_eq!(r.payload(), &(got.len() as u32).to_le_bytes());
            got.push(r.seq());
        }
        let acked: Vec<Seq> = records.iter().map(|r| r.seq()).collect();
        outbox.ack_many(&acked).expect("ack");
    }
    assert_eq!(got, seqs, "every record of the backlog, in order");
    outbox.sync().expect("sync");
    assert!(
        outbox.stats().segments <= 2,
        "the drained segments were deleted"
    );
    outbox.close().expect("close");
}
