//! ENOSPC on a real file system: on a full tmpfs, the append that finds no
//! space poisons the outbox with the operating system's ENOSPC, every append
//! that returned Ok is recovered intact, and appends work again once space
//! returns. Needs to mount a tmpfs (root); without it the test says it skips.

use std::io::Write;

use segwal::{Error, Options, Outbox, Seq};

use crate::drain;
use crate::tmpfs::Tmpfs;

const ENOSPC: i32 = 28;
const RECORD_BYTES: usize = 4096;
/// Size of the file system: a few segments of 256 KiB (and a reserve of one).
const TMPFS_SIZE: &str = "2m";
/// Space taken before the outbox opens, and given back once it is full.
const FILLER_BYTES: usize = 512 * 1024;

/// The `i`-th record: its index, then bytes derived from it.
fn record(i: usize) -> Vec<u8> {
    let mut p = format!("enospc record {i};").into_bytes();
    let fill = (0..).map(|k: usize| k.wrapping_mul(31).wrapping_add(i.wrapping_mul(7)) as u8);
    p.extend(fill.take(RECORD_BYTES - p.len()));
    p
}

/// The OS error code behind a segwal error, if any.
fn os_error(e: &Error) -> Option<i32> {
    let source = std::error::Error::source(e)?;
    source
        .downcast_ref::<std::io::Error>()
        .and_then(std::io::Error::raw_os_error)
}

/// Checks that `outbox` holds every record of `acked`, in order and intact, and
/// after them nothing but the records of the one append in doubt; before them
/// only records of `earlier` (acknowledged ones come back until their segment is
/// deleted). Acknowledges everything it saw, and returns the records after
/// `earlier` with their indexes.
fn check_recovered(
    outbox: &Outbox,
    earlier: &[(Seq, usize)],
    acked: &[(Seq, usize)],
    in_doubt: Option<usize>,
) -> Vec<(Seq, usize)> {
    let records = drain(outbox);
    let first = acked.first().map(|a| a.0).expect("records to check");
    let old = records.iter().take_while(|r| r.seq() < first).count();
    for r in &records[..old] {
        let i = earlier
            .iter()
            .find(|e| e.0 == r.seq())
            .unwrap_or_else(|| panic!("seq {} came back from nowhere", r.seq()))
            .1;
        assert!(r.payload() == record(i), "record {i} came back damaged");
    }
    let records_now = &records[old..];
    assert!(
        records_now.len() >= acked.len(),
        "{} records recovered, {} were acknowledged",
        records_now.len(),
        acked.len()
    );
    for (r, &(seq, i)) in records_now.iter().zip(acked) {
        assert_eq!(r.seq(), seq, "record {i} recovered under another seq");
        assert!(r.payload() == record(i), "record {i} recovered damaged");
    }
    // The append that failed is in doubt: it may be there, whole, or not at all.
    let mut now = acked.to_vec();
    let extra = &records_now[acked.len()..];
    match (extra, in_doubt) {
        ([], _) => {}
        ([r], Some(i)) => {
            assert!(r.payload() == record(i), "an unknown record came back");
            now.push((r.seq(), i));
        }
        _ => panic!(
            "{} unexpected records after the acknowledged ones",
            extra.len()
        ),
    }
    let seqs: Vec<Seq> = records.iter().map(|r| r.seq()).collect();
    outbox.ack_many(&seqs).expect("ack recovered records");
    now
}

#[test]
fn a_full_file_system_poisons_with_enospc_and_appends_work_again_once_space_returns() {
    let tmp = tempfile::tempdir().expect("temporary directory");
    let mount_point = tmp.path().join("mnt");
    std::fs::create_dir(&mount_point).expect("mount point");
    // Declared after `tmp` and before every open file, so that it unmounts after
    // they are closed and before the temporary directory is removed.
    let _tmpfs = match Tmpfs::mount(&mount_point, TMPFS_SIZE) {
        Ok(tmpfs) => tmpfs,
        Err(why) => {
            println!("skipping: cannot mount tmpfs ({why})");
            return;
        }
    };
    let filler = mount_point.join("filler");
    let mut f = std::fs::File::create(&filler).expect("create filler");
    f.write_all(&vec![0xF1; FILLER_BYTES])
        .expect("write filler");
    drop(f);
    let dir = mount_point.join("outbox");
    // No free-disk floor: this test fills the file system to its last byte.
    let options = || {
        Options::default()
            .segment_bytes(256 * 1024)
            .min_free_disk_bytes(0)
    };

    // Fill the file system.
    let outbox = Outbox::open(&dir, options()).expect("open on the empty tmpfs");
    // A creation a crash interrupted, its header garbled, for the next open:
    // it sets it aside (the quarantine folder exists, so moving it needs no
    // space) before it finds the disk full, and the report must say so after
    // the retry.
    std::fs::create_dir(dir.join(segwal::QUARANTINE_DIR)).expect("quarantine folder");
    let unfinished = dir.join("00000000000000999999.seg.creating");
    std::fs::write(&unfinished, vec![0xEE; 4096]).expect("unfinished creation");
    let mut acked = Vec::new();
    let error = loop {
        let i = acked.len();
        match outbox.append(&record(i)) {
            Ok(seq) => acked.push((seq, i)),
            Err(e) => break e,
        }
        assert!(i < 1000, "2 MiB never filled up");
    };
    let failed = acked.len();
    assert!(failed > 100, "only {failed} records fit before the failure");
    match &error {
        Error::Poisoned { op, .. } => assert!(
            [
                "write",
                "create segment",
                "write segment header",
                "sync segment header"
            ]
            .contains(op),
            "poisoned by {op}: {error}"
        ),
        other => panic!("expected Poisoned, got {other:?}"),
    }
    assert_eq!(os_error(&error), Some(ENOSPC), "{error}");
    assert!(outbox.stats().poisoned);
    assert!(
        matches!(outbox.append(b"small"), Err(Error::Poisoned { .. })),
        "an append after the failure was not refused"
    );
    assert!(matches!(outbox.close(), Err(Error::Poisoned { .. })));
    drop(outbox);

    // Take every byte left, so that not one block is free.
    let top_up = mount_point.join("top-up");
    let mut f = std::fs::File::create(&top_up).expect("create top-up");
    while f.write_all(&[0xF2; 512]).is_ok() {}
    drop(f);

    // A full disk still opens (recovery writes a new active segment and a
    // seal: the reserve the outbox kept gives the room) and drains: every
    // acknowledged record comes back, and acknowledging them deletes segments,
    // which frees space without anyone else's help.
    let outbox = Outbox::open(&dir, options()).expect("reopen on the full file system");
    assert!(outbox.recovery_report().reserve_released);
    assert!(
        outbox
            .recovery_report()
            .quarantined
            .iter()
            .any(|q| q.from.file_name() == unfinished.file_name()),
        "{:?}",
        outbox.recovery_report()
    );
    // No room for a new reserve: appends are refused, without poisoning, so
    // that the space left stays the next open's, and that open works.
    assert!(outbox.stats().reserve_missing);
    for _ in 0..3 {
        match outbox.append(&record(failed + 99)) {
            Err(Error::QuotaExceeded {
                quota: "reserve", ..
            }) => {}
            other => panic!("expected the reserve's refusal, got {other:?}"),
        }
    }
    assert!(!outbox.stats().poisoned);
    // Refused appends spend nothing: not even a rotation (a few acks first,
    // so that the active segment holds more than its header; then appends
    // larger than a segment).
    for r in outbox.claim(3).expect("claim") {
        outbox.ack(r.seq()).expect("ack");
    }
    outbox.sync().expect("sync");
    let files = crate::segment_files(&dir);
    for _ in 0..3 {
        assert!(matches!(
            outbox.append(&vec![0x5a; 300 * 1024]),
            Err(Error::QuotaExceeded {
                quota: "reserve",
                ..
            })
        ));
    }
    assert_eq!(
        crate::segment_files(&dir),
        files,
        "a refused append rotated"
    );
    outbox.close().expect("close with no reserve");
    // A `RESERVE` a crash left short (between its creation and its
    // reservation, in one of the writer's tries) is not the reserve.
    std::fs::write(dir.join("RESERVE"), b"").expect("an empty RESERVE");
    let outbox = Outbox::open(&dir, options()).expect("reopen, the disk still full");
    assert!(outbox.stats().reserve_missing);
    assert!(matches!(
        outbox.append(&record(failed + 98)),
        Err(Error::QuotaExceeded {
            quota: "reserve",
            ..
        })
    ));
    let recovered = check_recovered(&outbox, &[], &acked[3..], Some(failed));
    outbox.sync().expect("sync");
    let deleted = outbox.stats().segments_deleted;
    assert!(deleted > 0, "draining a full disk deleted no segment");
    // Without a reserve, no deleted segment is kept for recycling: its space
    // is the reserve's.
    let kept: Vec<String> = std::fs::read_dir(&dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".seg.free"))
        .collect();
    assert!(kept.is_empty(), "kept for recycling: {kept:?}");
    // The space the drain freed takes new appends, the filler still there.
    let freed: Vec<(Seq, usize)> = (0..8)
        .map(|k| {
            let i = failed + 100 + k;
            (
                outbox.append(&record(i)).expect("append into freed space"),
                i,
            )
        })
        .collect();
    assert!(
        !outbox.stats().reserve_missing,
        "the drain freed room for the reserve"
    );
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, options()).expect("reopen after the drain");
    let recovered = {
        let mut all = recovered;
        all.extend(check_recovered(&outbox, &all, &freed, None));
        all
    };
    outbox.close().expect("close");

    // Space returns: appends work again, and survive a reopen.
    std::fs::remove_file(&filler).expect("free space");
    std::fs::remove_file(&top_up).expect("free space");
    let outbox = Outbox::open(&dir, options()).expect("reopen with space");
    let again: Vec<(Seq, usize)> = (0..32)
        .map(|k| {
            let i = failed + 1 + k;
            (outbox.append(&record(i)).expect("appends work again"), i)
        })
        .collect();
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, options()).expect("reopen");
    check_recovered(&outbox, &recovered, &again, None);
    outbox.close().expect("close");
}
