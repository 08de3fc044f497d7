//! Segments: rotation by size and by age, deletion once fully acknowledged and
//! not before, and what `stats` reports about them.

use std::time::Duration;

use segwal::{Options, Outbox, Seq};

use crate::{drain, eventually, segment_files, small_segments, tmp};

#[test]
fn segments_rotate_by_size_and_are_named_by_their_first_seq() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    let seqs: Vec<Seq> = (0..100)
        .map(|_| outbox.append(&[1u8; 200]).expect("append"))
        .collect();
    let files = segment_files(&dir);
    assert!(
        files.len() >= 5,
        "64 KiB segments, 100 appends of a block each: {files:?}"
    );
    for file in &files {
        let name = file.file_name().and_then(|n| n.to_str()).expect("name");
        assert_eq!(name.len(), "00000000000000000001.seg".len());
        let first: u64 = name[..20].parse().expect("numeric name");
        assert!(
            seqs.contains(&Seq::from(first)) || first > seqs[99].get(),
            "{name} does not start at a record"
        );
    }
    // No segment grows far beyond the limit: a batch never spans two segments.
    for file in &files[..files.len() - 1] {
        let len = std::fs::metadata(file).expect("stat").len();
        // The segment's bytes, then the seal on a block of its own.
        assert!(len <= 16 * 4096 + 4096, "{} is {len} bytes", file.display());
    }
    assert_eq!(outbox.stats().segments, files.len());
}

#[test]
fn a_segment_is_deleted_once_fully_acknowledged_and_not_before() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    let seqs: Vec<Seq> = (0..60)
        .map(|_| outbox.append(&[2u8; 200]).expect("append"))
        .collect();
    let files = segment_files(&dir);
    assert!(files.len() >= 3);
    let first_of_second: u64 = files[1].file_name().and_then(|n| n.to_str()).expect("name")[..20]
        .parse()
        .expect("numeric");
    // Claim the first segment's records only: the later ones stay pending,
    // so that relocation (which carries forward records a relay holds out of
    // a segment with nothing pending) leaves the second segment alone.
    let in_first_count = seqs.iter().filter(|s| s.get() < first_of_second).count();
    let records = outbox.claim(in_first_count).expect("claim");
    // Acknowledge every record of the first segment but its last one.
    let in_first: Vec<Seq> = records
        .iter()
        .map(|r| r.seq())
        .filter(|s| s.get() < first_of_second)
        .collect();
    assert_eq!(in_first.len(), in_first_count);
    let (last, rest) = in_first.split_last().expect("records in the first segment");
    // Its last record goes back to pending: a record a relay holds may be
    // carried forward by relocation (tests/it/relocation.rs), a pending one
    // is read from where it lies, so it keeps its segment.
    outbox.release(*last).expect("release");
    outbox.ack_many(rest).expect("ack");
    outbox.sync().expect("barrier");
    assert!(
        files[0].exists(),
        "deleted while a record was unacknowledged"
    );
    let again = outbox.claim(1).expect("claim");
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].seq(), *last, "a released record goes first");
    outbox.ack(*last).expect("ack the last one");
    outbox.sync().expect("barrier: the deletion ran before it");
    assert!(!files[0].exists(), "a fully acknowledged segment was kept");
    assert!(files[1].exists());
    assert_eq!(outbox.stats().segments_deleted, 1);

    // Acknowledging everything frees every sealed segment.
    let rest = drain(&outbox);
    let all: Vec<Seq> = records.iter().chain(&rest).map(|r| r.seq()).collect();
    assert_eq!(all, seqs, "every record, once, in order");
    outbox.ack_many(&all).expect("ack all");
    outbox.sync().expect("barrier");
    let remaining = segment_files(&dir);
    assert_eq!(remaining.len(), 1, "only the active segment stays");
    let active_first: u64 = remaining[0]
        .file_name()
        .and_then(|n| n.to_str())
        .expect("name")[..20]
        .parse()
        .expect("numeric");
    outbox.close().expect("close");

    // The deletions were recorded: the reopened log has no gap, and no
    // acknowledged record comes back.
    let outbox = Outbox::open(&dir, small_segments()).expect("reopen after deletions");
    let back = drain(&outbox);
    assert!(back.iter().all(|r| r.seq().get() >= active_first));
    assert!(
        back.is_empty(),
        "acknowledged records came back: {}",
        back.len()
    );
    let next = outbox.append(b"after").expect("append");
    assert!(
        next > *all.last().expect("records"),
        "seq reused after deletions"
    );
}

/// A segment the open seals with every record in it acknowledged (the active
/// segment at the close) goes once the outbox is open, with nothing appended,
/// claimed or synced: an idle outbox does not keep it on disk.
#[test]
fn acknowledged_segments_an_open_finds_go_with_nothing_asked() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    for i in 0..100u32 {
        outbox.append(&i.to_le_bytes()).expect("append");
    }
    let seqs: Vec<Seq> = drain(&outbox).iter().map(|r| r.seq()).collect();
    assert_eq!(seqs.len(), 100);
    outbox.ack_many(&seqs).expect("ack");
    outbox.close().expect("close");
    assert_eq!(segment_files(&dir).len(), 1);

    let outbox = Outbox::open(&dir, Options::default()).expect("reopen");
    // Sealed by the open, fully acknowledged, deleted by the writer alone.
    eventually("the acknowledged segment deleted", || {
        outbox.stats().segments == 1
    });
    assert_eq!(segment_files(&dir).len(), 1);
    assert_eq!(outbox.stats().pending, 0);
    assert_eq!(outbox.stats().segments_deleted, 1);
    // Nothing comes back: every record was acknowledged before the close.
    assert!(outbox.claim(10).expect("claim").is_empty());
    outbox.close().expect("close");
}

#[test]
fn segments_are_deleted_in_log_order() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    for _ in 0..60 {
        outbox.append(&[3u8; 200]).expect("append");
    }
    let files = segment_files(&dir);
    let records = drain(&outbox);
    // Acknowledge everything except one record of the first segment, released
    // back to pending (so that relocation leaves it where it is): later
    // segments wait for it, so that a missing segment can always be told from a
    // deleted one.
    let keep = records[0].seq();
    outbox.release(keep).expect("release");
    let others: Vec<Seq> = records
        .iter()
        .map(|r| r.seq())
        .filter(|&s| s != keep)
        .collect();
    outbox.ack_many(&others).expect("ack");
    outbox.sync().expect("barrier");
    // None deleted (the acks frame may have opened one more).
    assert!(segment_files(&dir).starts_with(&files));
    assert_eq!(outbox.claim(1).expect("claim")[0].seq(), keep);
    outbox.ack(keep).expect("ack");
    outbox.sync().expect("barrier");
    assert_eq!(segment_files(&dir).len(), 1);
}

#[test]
fn an_idle_segment_rotates_by_age_so_acknowledged_space_is_freed() {
    let (_t, dir) = tmp();
    let options = Options::default().segment_age(Duration::from_millis(50));
    let outbox = Outbox::open(&dir, options).expect("open");
    let seq = outbox.append(b"lonely record").expect("append");
    let first_file = segment_files(&dir)[0].clone();
    eventually("the writer rotates the idle segment", || {
        segment_files(&dir).len() == 2
    });
    let records = outbox.claim(1).expect("claim");
    assert_eq!(records[0].seq(), seq);
    outbox.ack(seq).expect("ack");
    eventually("the acknowledged segment is deleted", || {
        !first_file.exists()
    });
    // It settles: the segment holding the acknowledgement rotates once more by
    // age (it holds delivery state) and goes, and a segment holding only the
    // deletion marker is not rotated again and again: one segment, the
    // same 200 ms later (a rotation caught half done, two segments while
    // the old one's deletion waits for its fsyncs, is looked at again).
    let mut settled = segment_files(&dir);
    let mut stable = false;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(200));
        let now = segment_files(&dir);
        if now == settled && now.len() == 1 {
            stable = true;
            break;
        }
        settled = now;
    }
    assert!(stable, "segments kept rotating: {settled:?}");
}

/// A segment whose first record a lone producer wrote on its own thread
/// (`Options::caller_writes`) still rotates by age: the writer thread, asleep
/// without a deadline, is woken for the one that batch brought.
#[test]
fn a_segment_a_lone_producer_wrote_itself_rotates_by_age() {
    for _ in 0..20 {
        let (_t, dir) = tmp();
        let options = Options::default().segment_age(Duration::from_millis(50));
        let outbox = Outbox::open(&dir, options).expect("open");
        outbox.append(b"written by its producer").expect("append");
        if outbox.stats().caller_batches == 0 {
            // The writer thread held its lock at that moment: again.
            continue;
        }
        eventually("the writer rotates the segment by age", || {
            segment_files(&dir).len() == 2
        });
        return;
    }
    panic!("no append of 20 was written on its producer's thread");
}

/// A segment acknowledged while it was still the active one goes once a
/// lone producer's own batch rotates past it: that batch leaves the deletion
/// to the writer thread (its producer returns once answered) and wakes the
/// thread for it, with no acknowledgement or sync to nudge it.
#[test]
fn a_segment_a_lone_producer_rotated_past_is_deleted_by_the_writer_thread() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, crate::small_segments()).expect("open");
    // Fourteen records and an acks frame fill the first segment
    // (`small_segments`: a header block and fifteen blocks).
    for i in 0..14u8 {
        outbox.append(&[i; 100]).expect("append");
    }
    let first_file = segment_files(&dir)[0].clone();
    assert_eq!(segment_files(&dir).len(), 1);
    let claimed = outbox.claim(100).expect("claim");
    assert_eq!(claimed.len(), 14);
    outbox.ack_through(claimed[13].seq()).expect("ack");
    outbox.sync().expect("sync");
    assert!(first_file.exists(), "the active segment is never deleted");
    // Written by this thread (the writer idle, nothing else queued): the
    // batch rotates, seals the acknowledged segment and returns.
    outbox.append(b"the next segment's first").expect("append");
    eventually("the acknowledged segment is deleted", || {
        !first_file.exists()
    });
    outbox.close().expect("close");
}

#[test]
fn stats_show_backlog_and_group_commit() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let empty = outbox.stats();
    assert_eq!(
        (empty.pending, empty.first_seq, empty.last_seq),
        (0, None, None)
    );
    assert_eq!(empty.oldest_pending_age, None);
    outbox.append_batch(&[[0u8; 10]; 4]).expect("batch");
    std::thread::sleep(Duration::from_millis(5));
    let claimed = outbox.claim(1).expect("claim");
    let stats = outbox.stats();
    assert_eq!((stats.pending, stats.claimed), (3, 1));
    assert_eq!(stats.backlog_bytes, 40);
    assert_eq!(stats.first_seq, Some(claimed[0].seq()));
    assert_eq!(stats.last_seq, Some(Seq::from(claimed[0].seq().get() + 3)));
    assert!(stats.oldest_unacked_age.expect("age") >= Duration::from_millis(5));
    assert!(stats.oldest_pending_age.is_some());
    assert_eq!(stats.records_appended, 4);
    assert_eq!(stats.batches, 1);
    assert_eq!(stats.records_per_batch, 4.0);
    assert!(stats.fsyncs >= 1);
    assert!(stats.disk_bytes > 40);
    assert!(!stats.poisoned);
}

/// Closed, an outbox's figures are those it had when the close was done,
/// not an empty outbox's: a metrics endpoint scraped during a shutdown must
/// not report the dead letters gone.
#[test]
fn stats_of_a_closed_outbox_are_those_at_close() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let seqs = outbox.append_batch(&[[1u8; 10]; 5]).expect("batch");
    let claimed = outbox.claim(2).expect("claim");
    outbox
        .dead_letter(claimed[0].seq(), "refused")
        .expect("dead_letter");
    outbox.ack(claimed[1].seq()).expect("ack");
    let open = outbox.stats();
    assert_eq!((open.pending, open.dead_letters), (3, 1), "{open:?}");
    let other = outbox.clone();
    outbox.close().expect("close");
    for stats in [outbox.stats(), other.stats()] {
        assert_eq!(
            (stats.pending, stats.claimed, stats.dead_letters),
            (3, 0, 1),
            "{stats:?}"
        );
        assert_eq!(stats.backlog_bytes, 40, "{stats:?}");
        assert_eq!(stats.first_seq, Some(seqs[0]), "{stats:?}");
        // The close wrote the dead letter's and the ack's frames too.
        assert!(stats.last_seq >= Some(seqs[4]), "{stats:?}");
        assert_eq!(stats.segments, open.segments, "{stats:?}");
        assert!(stats.disk_bytes > 0, "{stats:?}");
        assert_eq!(stats.records_appended, 5);
        assert!(stats.fsyncs >= open.fsyncs);
    }
}

/// Space reserved ahead of the writer is visible, and small while the outbox is
/// idle: a new segment reserves 4 MiB, more as it fills, never more than
/// `segment_bytes`; a close gives back what was not used.
#[test]
fn reserved_space_is_reported_and_grows_with_the_writes() {
    use std::os::unix::fs::MetadataExt;
    let (_t, dir) = tmp();
    let on_disk = |dir: &std::path::Path| -> u64 {
        segment_files(dir)
            .iter()
            .map(|p| std::fs::metadata(p).expect("stat").blocks() * 512)
            .sum()
    };
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let empty = outbox.stats();
    assert_eq!(empty.allocated_bytes, on_disk(&dir));
    assert!(
        empty.allocated_bytes <= (4 << 20) + 4096,
        "an empty outbox reserves {} bytes",
        empty.allocated_bytes
    );
    // 16 MiB of records: the reservation grows past the first 4 MiB, within
    // one 64 MiB segment.
    let record = vec![3u8; 64 << 10];
    for _ in 0..256 {
        outbox.append(&record).expect("append");
    }
    let full = outbox.stats();
    assert_eq!(full.segments, 1);
    assert_eq!(full.allocated_bytes, on_disk(&dir));
    assert!(full.allocated_bytes >= full.disk_bytes, "{full:?}");
    assert!(full.allocated_bytes > 16 << 20 && full.allocated_bytes <= 64 << 20);
    outbox.close().expect("close");
    // Closed, the files take about what was written.
    assert!(on_disk(&dir) < full.disk_bytes + (1 << 20));
}

/// The spare files kept for recycling (`<name>.seg.free`) in `dir`.
fn spare_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".seg.free"))
        .collect();
    files.sort();
    files
}

#[test]
fn a_fully_acknowledged_segment_is_written_again_as_a_later_one() {
    use std::os::unix::fs::MetadataExt;
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    let payload = |k: usize| vec![(k % 251) as u8; 200 + k % 300];
    let first: Vec<Seq> = (0..40)
        .map(|k| outbox.append(&payload(k)).expect("append"))
        .collect();
    let files = segment_files(&dir);
    assert!(files.len() >= 3, "{files:?}");
    let inode = std::fs::metadata(&files[0]).expect("stat").ino();
    // Every record of the first segment acknowledged: its file is kept, under
    // the spare's name, not deleted.
    let records = drain(&outbox);
    let first_of_second: u64 = files[1].file_name().and_then(|n| n.to_str()).expect("name")[..20]
        .parse()
        .expect("numeric");
    let in_first: Vec<Seq> = records
        .iter()
        .map(|r| r.seq())
        .filter(|s| s.get() < first_of_second)
        .collect();
    outbox.ack_many(&in_first).expect("ack");
    // The others go back to pending (records a relay holds may be carried
    // forward, and their segments deleted and recycled too).
    for r in records.iter().filter(|r| r.seq().get() >= first_of_second) {
        outbox.release(r.seq()).expect("release");
    }
    outbox.sync().expect("barrier");
    assert!(!files[0].exists());
    let spares = spare_files(&dir);
    assert_eq!(spares.len(), 1, "{spares:?}");
    assert_eq!(std::fs::metadata(&spares[0]).expect("stat").ino(), inode);
    assert_eq!(outbox.stats().segments_deleted, 1);
    // The next rotation writes the new segment into that file.
    let second: Vec<Seq> = (40..80)
        .map(|k| outbox.append(&payload(k)).expect("append"))
        .collect();
    assert!(spare_files(&dir).is_empty());
    assert_eq!(outbox.stats().segments_recycled, 1);
    let reused = segment_files(&dir)
        .into_iter()
        .find(|f| std::fs::metadata(f).expect("stat").ino() == inode)
        .expect("the spare's file is a segment again");
    let reused_first: u64 = reused.file_name().and_then(|n| n.to_str()).expect("name")[..20]
        .parse()
        .expect("numeric");
    assert!(reused_first > first.last().expect("appended").get());
    // What it holds now reads back, before and after a reopen, with every
    // other record not acknowledged.
    let expected: Vec<(Seq, Vec<u8>)> = first
        .iter()
        .chain(&second)
        .enumerate()
        .filter(|(_, s)| s.get() >= first_of_second)
        .map(|(k, s)| (*s, payload(k)))
        .collect();
    for k in 0..2 {
        let outbox = if k == 0 {
            outbox.clone()
        } else {
            Outbox::open(&dir, small_segments()).expect("reopen")
        };
        let got: Vec<(Seq, Vec<u8>)> = drain(&outbox)
            .into_iter()
            .map(|r| (r.seq(), r.payload().to_vec()))
            .collect();
        assert_eq!(got, expected, "pass {k}");
        outbox.close().expect("close");
    }
}

#[test]
fn with_recycling_off_an_acknowledged_segment_is_deleted() {
    let (_t, dir) = tmp();
    let options = small_segments().recycle_segments(false);
    let outbox = Outbox::open(&dir, options.clone()).expect("open");
    for _ in 0..40 {
        outbox.append(&[3u8; 200]).expect("append");
    }
    let all: Vec<Seq> = drain(&outbox).iter().map(|r| r.seq()).collect();
    outbox.ack_many(&all).expect("ack");
    outbox.sync().expect("barrier");
    for _ in 0..40 {
        outbox.append(&[4u8; 200]).expect("append");
    }
    assert!(spare_files(&dir).is_empty());
    let stats = outbox.stats();
    assert!(stats.segments_deleted >= 2, "{stats:?}");
    assert_eq!(stats.segments_recycled, 0);
}

#[test]
fn a_kept_file_that_is_not_this_outboxs_is_set_aside_and_one_that_is_is_used() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, small_segments()).expect("open");
    for k in 0..40u8 {
        outbox.append(&[k; 200]).expect("append");
    }
    let all: Vec<Seq> = drain(&outbox).iter().map(|r| r.seq()).collect();
    outbox.ack_many(&all).expect("ack");
    outbox.sync().expect("barrier");
    outbox.close().expect("close");
    let ours = spare_files(&dir);
    assert_eq!(ours.len(), 1, "{ours:?}");
    // A file named like a kept one that segwal did not write.
    let foreign = dir.join("00000000000000000007.seg.free");
    std::fs::write(&foreign, b"not a segment, but named like a kept one").expect("write");

    let outbox =
        Outbox::open(&dir, small_segments()).expect("a foreign kept file does not stop the open");
    let report = outbox.recovery_report();
    assert_eq!(report.quarantined.len(), 1, "{report:?}");
    assert_eq!(
        report.quarantined[0].reason,
        segwal::QuarantineReason::UnfinishedRecycling
    );
    assert!(!foreign.exists());
    assert_eq!(
        std::fs::read(&report.quarantined[0].to).expect("kept aside"),
        b"not a segment, but named like a kept one"
    );
    // Ours is written into at the next rotation.
    for k in 0..40u8 {
        outbox.append(&[k; 200]).expect("append");
    }
    assert_eq!(outbox.stats().segments_recycled, 1);
    assert!(spare_files(&dir).is_empty());
    outbox.close().expect("close");
}

/// What the owner counts of its segments (`disk_bytes`, `last_seq`) is what
/// an offline check of the same directory finds, seals included: after
/// rotations, at a close, after an open that sealed the newest segment, and
/// after one that sealed a newest segment cut back to no frame.
#[test]
fn the_owner_counts_its_segments_as_an_offline_check_does_seals_included() {
    let (_t, dir) = crate::tmp();
    let options = || segwal::Options::default().segment_bytes(64 << 10);
    for round in 0..3 {
        if round == 2 {
            // The newest segment torn inside its first frame: the open cuts
            // it back to no frame and seals it there.
            let newest = segment_files(&dir).pop().expect("a segment");
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&newest)
                .expect("open the newest segment");
            file.set_len(4096 + 20).expect("tear it");
        }
        let outbox = segwal::Outbox::open(&dir, options()).expect("open");
        for b in 0..100 {
            let batch: Vec<String> = (0..50).map(|i| format!("r{round}-{b:04}-{i:04}")).collect();
            outbox.append_batch(&batch).expect("append_batch");
        }
        let stats = outbox.stats();
        outbox.close().expect("close");
        let found = segwal::verify(&dir).expect("verify");
        let states = found.states.expect("states");
        assert_eq!(
            (stats.disk_bytes, stats.last_seq),
            (states.disk_bytes, states.last_seq),
            "round {round}: {stats:?}"
        );
    }
}

/// `Stats::fsyncs` counts every `fdatasync` the outbox makes once open: a
/// simulated disk's trace of a run with deletions (each with its directory
/// fsync) and a close (which gives back the active segment's space) holds
/// exactly as many syncs as the counter says.
#[test]
fn fsyncs_counts_every_sync_deletions_included() {
    let disk = segwal::sim::SimDisk::new(41);
    let options = small_segments()
        .recycle_segments(false)
        .ack_durability(segwal::Durability::Sync);
    let outbox = Outbox::open_with_storage("/outbox", options, std::sync::Arc::new(disk.clone()))
        .expect("open");
    let before = outbox.stats().fsyncs;
    disk.start_trace();
    for i in 0..300u32 {
        let seq = outbox.append(&[i as u8; 600]).expect("append");
        let got = outbox.claim(1).expect("claim");
        assert_eq!(got[0].seq(), seq);
        outbox.ack(seq).expect("ack");
    }
    outbox.close().expect("close");
    let stats = outbox.stats();
    assert!(stats.segments_deleted > 5, "{stats:?}");
    let syncs = disk
        .trace()
        .iter()
        .filter(|op| op.contains(": sync_data ") || op.contains(": sync_dir "))
        .count() as u64;
    assert_eq!(stats.fsyncs - before, syncs, "{stats:?}");
}

/// A power cut at any step of an open that seals the newest segment and
/// creates the next sets aside no more than a block: a new segment's space
/// is reserved only once its file bears the segment's name durably. (With
/// the space reserved before its header was durable, or before its name
/// was, a header garbled by the cut or a grown size that came back without
/// its data sent megabytes of a file that never held a frame into
/// `quarantine/`.)
#[test]
fn a_power_cut_while_a_segment_is_created_sets_aside_at_most_a_block() {
    use segwal::io::Storage;
    use segwal::sim::{CrashModel, SimDisk};
    use std::sync::Arc;
    let options = Options::default().segment_bytes(8 << 20);
    let disk = SimDisk::new(3);
    let outbox = Outbox::open_with_storage("/outbox", options.clone(), Arc::new(disk.clone()))
        .expect("open");
    let seqs: Vec<Seq> = (0..10)
        .map(|i| {
            let mut p = format!("record {i};").into_bytes();
            p.resize(1000, b'x');
            outbox.append(&p).expect("append")
        })
        .collect();
    outbox.close().expect("close");
    disk.record_snapshots();
    let outbox = Outbox::open_with_storage("/outbox", options.clone(), Arc::new(disk.clone()))
        .expect("the open the power cuts interrupt");
    let snapshots = disk.take_snapshots();
    outbox.close().expect("close");
    let models = [
        CrashModel {
            grown_tail: 100,
            ..CrashModel::default()
        },
        CrashModel {
            block_garbled: 100,
            ..CrashModel::default()
        },
    ];
    for (k, snapshot) in snapshots.iter().enumerate() {
        for (draw, model) in models.into_iter().cycle().take(16).enumerate() {
            let d = snapshot.fork(1001 + 7 * (draw as u64 / 2));
            d.crash(model);
            let what = format!("power cut at step {k}, draw {draw}");
            let outbox = Outbox::open_with_storage("/outbox", options.clone(), Arc::new(d.clone()))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            for q in &outbox.recovery_report().quarantined {
                let len = d.open(&q.to).and_then(|f| f.len());
                assert!(
                    len.as_ref().is_ok_and(|&len| len <= 4096),
                    "{what}: {:?} set aside with {len:?} bytes",
                    q.from
                );
            }
            let got: Vec<Seq> = drain(&outbox).iter().map(segwal::Record::seq).collect();
            assert_eq!(got, seqs, "{what}");
            outbox.close().expect("close");
        }
    }
}
