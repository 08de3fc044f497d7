//! Crash safety on the simulated disk: crash at every I/O step, the fault loop,
//! bit rot at rest, rotten reads, and the negative controls that prove the
//! harness sees what it checks. Budgets come from the environment so that CI runs
//! a bounded amount and a long run is one variable away (docs/RELIABILITY.md).

use std::time::Instant;

use segwal::sim::Bug;
use segwal::sim::harness::{self, Figures, Violation, Workload};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `check` over `seeds` seeds on two threads; panics at the first
/// violation with everything that reproduces it.
fn over_seeds(
    first: u64,
    seeds: u64,
    check: impl Fn(u64) -> Result<Figures, Violation> + Sync,
) -> Figures {
    let halves: Vec<Figures> = std::thread::scope(|scope| {
        let check = &check;
        let workers: Vec<_> = (0..2u64)
            .map(|w| {
                scope.spawn(move || {
                    let mut total = Figures::default();
                    // Long runs report as they go (SEGWAL_PROGRESS=N: every N seeds),
                    // so that an interrupted run still leaves its figures.
                    let every = env("SEGWAL_PROGRESS", 0);
                    for seed in (first..first + seeds).filter(|s| s % 2 == w) {
                        match check(seed) {
                            Ok(f) => total.add(&f),
                            Err(v) => panic!("{v}"),
                        }
                        if every > 0 && (seed - first) % every < 2 {
                            eprintln!("progress: worker {w} at seed {seed}: {total:?}");
                        }
                    }
                    total
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect()
    });
    let mut total = Figures::default();
    for h in &halves {
        total.add(h);
    }
    total
}

/// The workload of `seed`: one in ten also rotates segments by age, one in
/// ten has producers appending from several threads at once.
fn workload_of(seed: u64, steps: usize) -> Workload {
    let workload = Workload::random(seed, steps);
    match seed % 10 {
        9 => workload.with_age_rotation(),
        8 => workload.with_concurrent_producers(),
        _ => workload,
    }
}

/// Seeds beyond the CI range that once found a fault in a longer run, each
/// checked as `crash_at_every_io_step_loses_no_acknowledged_record` checks
/// its own: 300,358 (four producers at once went over the backlog quota, and
/// the harness took the refusal of one for a failure on a healthy disk).
#[test]
fn crash_at_every_io_step_regression_seeds() {
    for seed in [300_358] {
        if let Err(v) = harness::crash_every_step(seed, &workload_of(seed, 40), 2, None) {
            panic!("{v}");
        }
    }
}

#[test]
fn crash_at_every_io_step_loses_no_acknowledged_record() {
    let seeds = env("SEGWAL_CRASH_SEEDS", 1000);
    let first = env("SEGWAL_CRASH_FIRST_SEED", 1);
    let draws = env("SEGWAL_CRASH_DRAWS", 2);
    let steps = env("SEGWAL_CRASH_STEPS", 40) as usize;
    let started = Instant::now();
    let total = over_seeds(first, seeds, |seed| {
        harness::crash_every_step(seed, &workload_of(seed, steps), draws, None)
    });
    println!(
        "crash harness: seeds {first}..{}, {} crash points x {draws} draws = {} simulated crashes \
         ({} also crashed inside recovery), {} torn tails cut, {} unfinished creations \
         or recyclings set aside, {} records checked, {} rotations by age, {} batches shared by \
         concurrent producers, {} segments recycled, {} steps with a deletion held for its ids, \
         {} opens through index checkpoints, {:.1} s",
        first + seeds,
        total.crash_points,
        total.recoveries,
        total.crashes_in_recovery,
        total.torn_tails,
        total.quarantined,
        total.records_checked,
        total.age_rotations,
        total.shared_batches,
        total.recycled,
        total.held_steps,
        total.checkpointed,
        started.elapsed().as_secs_f64()
    );
    if seeds >= 10 {
        assert!(
            total.age_rotations > 0,
            "no workload rotated a segment by age"
        );
        assert!(
            total.shared_batches > 0,
            "no batch held several producers' records"
        );
    }
    assert!(
        total.torn_tails > 0,
        "no crash tore a tail: the harness is not crashing mid-write"
    );
    assert!(total.crashes_in_recovery > 0, "no recovery was crashed");
    assert!(
        total.recycled > 0,
        "no workload recycled a segment: the harness does not test recycling"
    );
    assert!(
        total.checkpointed > 0,
        "no open after a crash read the newest segment through index checkpoints"
    );
    if seeds >= 100 {
        assert!(
            total.quarantined > 0,
            "no crash garbled a segment's header while it was created: the \
             harness never tests setting one aside"
        );
    }
}

/// Relocation under crashes: workloads whose relay keeps up but parks a few
/// records as dead letters or holds them claimed, so that the records are
/// carried forward out of old segments, with `max_attempts` set so that every
/// attempt is durable. Every invariant holds at every crash point, including
/// I12 (attempts never decrease); and relocation does happen.
#[test]
fn crash_at_every_io_step_while_stragglers_are_relocated() {
    let seeds = env("SEGWAL_RELOCATION_SEEDS", 100);
    let steps = env("SEGWAL_CRASH_STEPS", 40) as usize * 5 / 2;
    let started = Instant::now();
    let first = env("SEGWAL_CRASH_FIRST_SEED", 1);
    let total = over_seeds(first, seeds, |seed| {
        harness::crash_every_step(seed, &Workload::stragglers(seed, steps), 2, None)
    });
    println!(
        "crash harness, stragglers: {seeds} seeds, {} crash points, {} simulated crashes, \
         {} records checked, {} records relocated, {} leases run out and handed out \
         again, {:.1} s",
        total.crash_points,
        total.recoveries,
        total.records_checked,
        total.relocated,
        total.leases_expired,
        started.elapsed().as_secs_f64()
    );
    assert!(
        total.relocated > 0,
        "no workload relocated a record: the harness does not test relocation"
    );
    assert!(
        total.leases_expired > 0,
        "no lease ran out and came back: the harness does not test leases"
    );
}

/// Deletions held back for the deduplication ids they would carry, under
/// crashes: appends of many ids never used before, in small segments, with a
/// relay that keeps up. Every invariant holds at every crash point (I16
/// among them: an id used again is answered as a duplicate after every
/// crash); and deletions do wait.
#[test]
fn crash_at_every_io_step_while_deletions_wait_for_ids() {
    let seeds = env("SEGWAL_MANY_IDS_SEEDS", 60);
    let first = env("SEGWAL_CRASH_FIRST_SEED", 1);
    let steps = env("SEGWAL_CRASH_STEPS", 40) as usize;
    let started = Instant::now();
    let total = over_seeds(first, seeds, |seed| {
        harness::crash_every_step(seed, &Workload::many_ids(seed, steps), 2, None)
    });
    println!(
        "crash harness, many ids: {seeds} seeds, {} crash points, {} simulated crashes, \
         {} records checked, {} steps with a deletion held for its ids, {:.1} s",
        total.crash_points,
        total.recoveries,
        total.records_checked,
        total.held_steps,
        started.elapsed().as_secs_f64()
    );
    assert!(
        total.held_steps > 0,
        "no deletion waited for its ids: the harness does not test held deletions"
    );
}

/// Large writes under crashes: appends of 64 to 128 KiB, whose frames the
/// writer puts straight into space never written, with no zeros ahead (the
/// random and straggler workloads write far less at a time). Every invariant
/// holds at every crash point; and such batches do happen.
#[test]
fn crash_at_every_io_step_with_large_writes() {
    let seeds = env("SEGWAL_LARGE_WRITE_SEEDS", 8);
    let first = env("SEGWAL_CRASH_FIRST_SEED", 1);
    let steps = env("SEGWAL_CRASH_STEPS", 40) as usize;
    let started = Instant::now();
    let total = over_seeds(first, seeds, |seed| {
        harness::crash_every_step(seed, &Workload::large_writes(seed, steps), 2, None)
    });
    println!(
        "crash harness, large writes: seeds {first}..{}, {} crash points, {} simulated \
         crashes, {} torn tails cut, {} records checked, {} batches with no zeros ahead, {:.1} s",
        first + seeds,
        total.crash_points,
        total.recoveries,
        total.torn_tails,
        total.records_checked,
        total.large_writes_unzeroed,
        started.elapsed().as_secs_f64()
    );
    assert!(
        total.large_writes_unzeroed > 0,
        "no batch of large frames went into unwritten space without zeros ahead"
    );
    assert!(total.torn_tails > 0, "no crash tore a tail of large writes");
}

/// Workloads whose every operation the fault loop fails, once and persistently.
fn canonical_workloads() -> Vec<(u64, Workload)> {
    (1..=env("SEGWAL_FAULT_WORKLOADS", 6))
        .map(|seed| (seed, Workload::random(1000 + seed, 30)))
        .collect()
}

#[test]
fn fault_loop_fails_every_io_operation_once_and_persistently() {
    let started = Instant::now();
    let workloads = canonical_workloads();
    let total = over_seeds(0, workloads.len() as u64, |i| {
        let (seed, workload) = &workloads[i as usize];
        harness::fault_loop(*seed, workload, None)
    });
    println!(
        "fault loop: {} workloads, {} faults injected, {} records checked, {:.1} s",
        workloads.len(),
        total.faults,
        total.records_checked,
        started.elapsed().as_secs_f64()
    );
    assert!(total.faults > 100);
}

#[test]
fn bit_rot_at_rest_is_refused_or_harmless() {
    let total = over_seeds(1, env("SEGWAL_ROT_SEEDS", 40), |seed| {
        harness::bit_rot(seed, &Workload::random(seed, 40), 8, None)
    });
    println!(
        "bit rot: {} flips, {} harmless recoveries; in the newest segment {} flips, {} harmless; \
         inside a sealed segment's frames {} flips, {} harmless",
        total.faults,
        total.recoveries,
        total.newest_flips,
        total.newest_harmless,
        total.frame_flips,
        total.frame_harmless
    );
    assert!(total.faults > 0);
    assert!(total.newest_flips > 0);
    assert!(total.frame_flips > 0);
}

#[test]
fn rotten_reads_never_hand_out_garbage() {
    let total = over_seeds(1, env("SEGWAL_ROT_SEEDS", 40), |seed| {
        harness::rotten_reads(seed, &Workload::random(seed, 60), 20, None)
    });
    assert!(total.faults > 0);
}

/// Seeds within which the harness must catch each injected bug.
const CONTROL_SEEDS: u64 = 30;

/// The first violation `check` reports over the control seeds, if any.
fn caught(check: impl Fn(u64) -> Result<Figures, Violation>) -> Option<Violation> {
    (1..=CONTROL_SEEDS).find_map(|seed| check(seed).err())
}

#[test]
fn negative_controls_every_known_bug_is_caught() {
    let crash = |bug| {
        caught(|seed| harness::crash_every_step(seed, &Workload::random(seed, 30), 2, Some(bug)))
    };
    let controls: Vec<(Bug, Option<Violation>)> = vec![
        (Bug::AckBeforeFsync, crash(Bug::AckBeforeFsync)),
        (Bug::NoDirSyncAfterCreate, crash(Bug::NoDirSyncAfterCreate)),
        (Bug::DeleteLiveSegment, crash(Bug::DeleteLiveSegment)),
        (Bug::UnalignedSyncGroups, crash(Bug::UnalignedSyncGroups)),
        (Bug::ForgetAcksAtRecovery, crash(Bug::ForgetAcksAtRecovery)),
        (Bug::IgnoreKeys, crash(Bug::IgnoreKeys)),
        (
            Bug::ForgetFieldsAtRecovery,
            crash(Bug::ForgetFieldsAtRecovery),
        ),
        (Bug::ForgetTombstones, crash(Bug::ForgetTombstones)),
        (
            Bug::RecycleHeaderUnsynced,
            crash(Bug::RecycleHeaderUnsynced),
        ),
        (
            Bug::CheckpointHidesInternal,
            crash(Bug::CheckpointHidesInternal),
        ),
        (
            Bug::QuotaWritesAnyway,
            caught(|seed| {
                harness::crash_every_step(
                    seed,
                    &Workload::random(seed, 30).with_quota(4),
                    1,
                    Some(Bug::QuotaWritesAnyway),
                )
            }),
        ),
        (
            Bug::ForgetDeadLettersAtRecovery,
            crash(Bug::ForgetDeadLettersAtRecovery),
        ),
        (
            Bug::RelocationDropsRecord,
            caught(|seed| {
                harness::crash_every_step(
                    seed,
                    &Workload::stragglers(seed, 60),
                    1,
                    Some(Bug::RelocationDropsRecord),
                )
            }),
        ),
        (
            Bug::AttemptsInMemoryOnly,
            caught(|seed| {
                harness::crash_every_step(
                    seed,
                    &Workload::stragglers(seed, 60),
                    1,
                    Some(Bug::AttemptsInMemoryOnly),
                )
            }),
        ),
        (
            Bug::TruncateMidLogCorruption,
            caught(|seed| {
                harness::bit_rot(
                    seed,
                    &Workload::random(seed, 40),
                    8,
                    Some(Bug::TruncateMidLogCorruption),
                )
            }),
        ),
        (
            Bug::NewestDamageIsTorn,
            caught(|seed| {
                // Every third draw flips a bit in the newest segment, where
                // most bytes are padding: more draws than the others.
                harness::bit_rot(
                    seed,
                    &Workload::random(seed, 40),
                    48,
                    Some(Bug::NewestDamageIsTorn),
                )
            }),
        ),
        (
            Bug::RetryFailedFsync,
            caught(|seed| {
                harness::fault_loop(
                    seed,
                    &Workload::random(seed, 12),
                    Some(Bug::RetryFailedFsync),
                )
            }),
        ),
        (
            Bug::SkipReadCrc,
            caught(|seed| {
                harness::rotten_reads(
                    seed,
                    &Workload::random(seed, 60),
                    20,
                    Some(Bug::SkipReadCrc),
                )
            }),
        ),
    ];
    let mut missed = Vec::new();
    for (bug, violation) in &controls {
        match violation {
            Some(v) => println!("negative control {bug:?} caught: {v}"),
            None => missed.push(*bug),
        }
    }
    assert!(
        missed.is_empty(),
        "the harness missed injected bugs: {missed:?}"
    );
}

/// On the simulated disk: a bad range of a sealed segment (reads fail with
/// EIO) and another sealed segment cut short by another program, under a
/// running outbox. Each costs the claims of the records it hit a typed error
/// naming the file; no panic, and every other record is delivered, in order.
#[test]
fn a_bad_range_and_a_file_cut_short_fail_claims_not_the_process() {
    use std::path::Path;
    use std::sync::Arc;

    use segwal::sim::SimDisk;
    use segwal::{Error, Options, Outbox, Seq};

    let disk = SimDisk::new(7);
    let dir = Path::new("/outbox");
    let options = Options::default().segment_bytes(16 * 4096);
    let outbox = Outbox::open_with_storage(dir, options, Arc::new(disk.clone())).expect("open");
    let seqs: Vec<Seq> = (0..60u8)
        .map(|i| outbox.append(&[i; 100]).expect("append"))
        .collect();
    let mut files = disk.files(dir);
    files.sort();
    let (first, second) = (dir.join(&files[0]), dir.join(&files[1]));
    // The third record of the first segment sits on a bad range; the second
    // segment loses everything from inside its fifth record on.
    assert!(disk.fail_reads_in(&first, 3 * 4096..3 * 4096 + 1));
    assert!(disk.shrink(&second, 5 * 4096 + 10));
    let mut delivered = Vec::new();
    let (mut io, mut corrupt) = (0, 0);
    loop {
        match outbox.claim(4) {
            Ok(records) if records.is_empty() => break,
            Ok(records) => {
                for r in records {
                    delivered.push(r.seq());
                    outbox.ack(r.seq()).expect("ack");
                }
            }
            Err(Error::Io { path, .. }) => {
                assert_eq!(path, first);
                io += 1;
            }
            Err(Error::Corrupt { path, offset, .. }) => {
                assert_eq!(path, second);
                assert!(offset >= 5 * 4096, "{offset}");
                corrupt += 1;
            }
            Err(e) => panic!("unexpected error {e}"),
        }
    }
    assert_eq!(io, 1, "the record on the bad range is held back once");
    assert!(corrupt >= 1);
    assert_eq!(delivered.len() + io + corrupt, seqs.len());
    let mut sorted = delivered.clone();
    sorted.sort();
    assert_eq!(sorted, delivered, "in order");
    assert!(delivered.ends_with(&seqs[30..]), "the later segments flow");
}

/// A record whose read fails (a bad range of the medium) is held back,
/// still claimed, while its lease runs, so the records after it flow; once
/// the lease runs out it is handed out again, as a later attempt, and its
/// claim fails again while the range stays bad. Nothing is lost: the
/// record is never set aside, as one whose bytes are bad would be.
#[test]
fn a_record_on_a_bad_range_is_held_back_for_its_lease_then_tried_again() {
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;

    use segwal::sim::SimDisk;
    use segwal::{Error, Options, Outbox};

    const LEASE: Duration = Duration::from_secs(2);
    let disk = SimDisk::new(11);
    let dir = Path::new("/outbox");
    let outbox =
        Outbox::open_with_storage(dir, Options::default().lease(LEASE), Arc::new(disk.clone()))
            .expect("open");
    let seqs: Vec<_> = (0..3u8)
        .map(|i| outbox.append(&[i; 100]).expect("append"))
        .collect();
    let file = dir.join(&disk.files(dir)[0]);
    // The first record's bytes: a fresh segment's frames start on its
    // second block.
    assert!(disk.fail_reads_in(&file, 4096..4097));
    let failed = Instant::now();
    match outbox.claim(1) {
        Err(Error::Io { path, .. }) => assert_eq!(path, file),
        other => panic!("expected Io, got {other:?}"),
    }
    let after = outbox.claim(10).expect("claim");
    if failed.elapsed() < LEASE {
        assert_eq!(
            after.iter().map(|r| r.seq()).collect::<Vec<_>>(),
            seqs[1..],
            "held back while its lease runs; the others flow"
        );
        assert_eq!(outbox.stats().claimed, 3);
    }
    for r in &after {
        outbox.ack(r.seq()).expect("ack");
    }
    std::thread::sleep(LEASE + Duration::from_millis(500));
    // Its lease ran out: it is handed out again, and the read fails again.
    match outbox.claim(10) {
        Err(Error::Io { path, .. }) => assert_eq!(path, file),
        other => panic!("expected Io again, got {other:?}"),
    }
    let stats = outbox.stats();
    assert_eq!(stats.corrupt_records, 0, "never set aside: {stats:?}");
    assert_eq!(stats.claimed, 1, "{stats:?}");
    outbox.close().expect("close");
}
