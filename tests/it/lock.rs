//! One owner: a directory is opened by one outbox at a time, within a process
//! and across processes, and a refused open names the directory and the owner.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use segwal::{Error, Options, Outbox};

use crate::tmp;

/// Set in the environment of the child process of the cross-process test.
const CHILD_DIR: &str = "SEGWAL_TEST_LOCK_CHILD_DIR";

#[test]
fn a_second_open_in_the_same_process_is_refused_with_the_owner() {
    let (_t, dir) = tmp();
    let first = Outbox::open(&dir, Options::default()).expect("open");
    match Outbox::open(&dir, Options::default()) {
        Err(e @ Error::Locked { .. }) => {
            let Error::Locked { dir: locked, pid } = &e else {
                unreachable!()
            };
            assert_eq!(locked, &dir);
            assert_eq!(*pid, Some(std::process::id()));
            assert!(e.to_string().contains(&dir.display().to_string()));
        }
        other => panic!("expected Locked, got {other:?}"),
    }
    // The refused open changed nothing: the first outbox still works.
    first.append(b"still mine").expect("append");
    first.close().expect("close");
    Outbox::open(&dir, Options::default()).expect("free after close");
}

#[test]
fn a_second_open_from_another_process_is_refused_until_it_exits() {
    let (_t, dir) = tmp();
    let exe = crate::this_binary();
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "lock::child_process_holding_the_lock",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, &dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn child");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let ready = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|line| line.ends_with("segwal-child: locked"));
    assert!(ready, "the child never reported holding the lock");
    match Outbox::open(&dir, Options::default()) {
        Err(Error::Locked { pid, .. }) => assert_eq!(pid, Some(child.id())),
        other => panic!("expected Locked, got {other:?}"),
    }
    // The lock is the directory's own: deleting the owner file (a stale-looking
    // pid file, to a cleanup script) lets no second outbox in; the error only
    // loses the pid.
    std::fs::remove_file(dir.join("OWNER")).expect("rm OWNER");
    match Outbox::open(&dir, Options::default()) {
        Err(Error::Locked { pid, .. }) => assert_eq!(pid, None),
        other => panic!("expected Locked after rm OWNER, got {other:?}"),
    }
    // Closing its stdin tells the child to exit; the kernel drops its lock. (The
    // test harness prints the test name on the same line before the child speaks.)
    drop(child.stdin.take());
    let status = child.wait().expect("child exits");
    assert!(status.success());
    let outbox = Outbox::open(&dir, Options::default()).expect("free after the child exits");
    assert_eq!(crate::drain_ack(&outbox), vec![b"from the child".to_vec()]);
}

/// The child half of the cross-process test: without its environment variable
/// (an ordinary test run) it has nothing to do.
#[test]
fn child_process_holding_the_lock() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let outbox = Outbox::open(&dir, Options::default()).expect("child open");
    outbox.append(b"from the child").expect("child append");
    let mut out = std::io::stdout();
    writeln!(out, "segwal-child: locked").expect("report");
    out.flush().expect("flush");
    // Hold the lock until the parent closes our stdin.
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    outbox.close().expect("child close");
}

/// Regression: a second `close` returned `Closed` before the first had joined
/// the writer and released the lock, so an immediate reopen got `Locked`.
#[test]
fn close_returns_only_once_the_directory_is_free() {
    let (_t, dir) = tmp();
    let buffered = || {
        Options::default()
            .durability(segwal::Durability::Buffered)
            .buffered_sync_interval(std::time::Duration::from_secs(3600))
    };
    for round in 0..30 {
        let outbox = Outbox::open(&dir, buffered()).expect("open");
        // Work for the closing writer: a final fsync of many records.
        for i in 0..2000u32 {
            outbox.append(&[i as u8; 64]).expect("append");
        }
        let closers: Vec<_> = (0..2)
            .map(|_| {
                let outbox = outbox.clone();
                let dir = dir.clone();
                std::thread::spawn(move || {
                    let closed = outbox.close();
                    drop(outbox);
                    // The close that did not do the work reopens at once: the
                    // directory must be free by the time it returned.
                    let reopened = matches!(closed, Err(Error::Closed))
                        .then(|| Outbox::open(&dir, Options::default()).map(|o| o.close()));
                    (closed.is_ok(), reopened)
                })
            })
            .collect();
        drop(outbox);
        let mut oks = 0;
        for closer in closers {
            let (ok, reopened) = closer.join().expect("closer");
            oks += usize::from(ok);
            if let Some(Err(e)) = reopened {
                panic!("round {round}: reopen after close failed: {e}");
            }
        }
        assert_eq!(oks, 1, "round {round}: exactly one close does the work");
    }
}

/// Within one process the lock is the directory itself: a deleted owner file
/// does not let a second outbox in.
#[test]
fn a_deleted_owner_file_does_not_let_a_second_open_in_within_the_process() {
    let (_t, dir) = tmp();
    let first = Outbox::open(&dir, Options::default()).expect("open");
    std::fs::remove_file(dir.join("OWNER")).expect("rm OWNER");
    assert!(matches!(
        Outbox::open(&dir, Options::default()),
        Err(Error::Locked { .. })
    ));
    first.close().expect("close");
}

/// `OWNER` is a hint segwal writes and reads, never a way into another file:
/// a symbolic link under that name does not get its target truncated or
/// read, a FIFO does not block an open or a read, and a file with a second
/// name keeps its bytes.
#[test]
fn the_owner_file_is_never_followed_into_another_file() {
    let (_t, dir) = tmp();
    std::fs::create_dir_all(&dir).expect("dir");
    let victim = dir.with_extension("victim");
    std::fs::write(&victim, b"4242\nsomeone else's bytes\n").expect("victim");

    std::os::unix::fs::symlink(&victim, dir.join("OWNER")).expect("symlink");
    assert_eq!(segwal::owner_pid(&dir), None, "read through a link");
    let outbox = Outbox::open(&dir, Options::default()).expect("open beside a linked OWNER");
    outbox.append(b"kept").expect("append");
    outbox.close().expect("close");
    assert_eq!(
        std::fs::read(&victim).expect("victim"),
        b"4242\nsomeone else's bytes\n"
    );

    std::fs::remove_file(dir.join("OWNER")).expect("unlink");
    std::fs::hard_link(&victim, dir.join("OWNER")).expect("hard link");
    let outbox = Outbox::open(&dir, Options::default()).expect("open beside a linked OWNER");
    assert_eq!(outbox.claim(1).expect("claim")[0].payload(), b"kept");
    outbox.close().expect("close");
    assert_eq!(
        std::fs::read(&victim).expect("victim"),
        b"4242\nsomeone else's bytes\n"
    );

    std::fs::remove_file(dir.join("OWNER")).expect("unlink");
    crate::mkfifo(&dir.join("OWNER"));
    // Neither blocks: a FIFO is opened without waiting for a peer, then
    // refused.
    assert_eq!(segwal::owner_pid(&dir), None);
    let outbox = Outbox::open(&dir, Options::default()).expect("open beside a FIFO");
    outbox.close().expect("close");
}

/// `RESERVE` is space segwal keeps for itself, never a way into another
/// file: a symbolic link or a second name under that name does not get its
/// target grown or written (the outbox then keeps no reserve, and works on).
#[test]
fn the_reserve_file_is_never_followed_into_another_file() {
    let (_t, dir) = tmp();
    std::fs::create_dir_all(&dir).expect("dir");
    let victim = dir.with_extension("victim");
    let bytes = b"someone else's bytes\n";
    std::fs::write(&victim, bytes).expect("victim");
    let options = Options::default().segment_bytes(1 << 20);
    for link in ["symbolic", "hard"] {
        let reserve = dir.join("RESERVE");
        if link == "symbolic" {
            std::os::unix::fs::symlink(&victim, &reserve).expect("symlink");
        } else {
            std::fs::hard_link(&victim, &reserve).expect("hard link");
        }
        let outbox = Outbox::open(&dir, options.clone()).expect("open beside a linked RESERVE");
        outbox.append(link.as_bytes()).expect("append");
        outbox.close().expect("close");
        let now = std::fs::read(&victim).expect("victim");
        assert!(
            now == bytes,
            "{link} link: the target is {} bytes",
            now.len()
        );
        let kept = std::fs::symlink_metadata(&reserve).expect("the link stays");
        assert_eq!(kept.file_type().is_symlink(), link == "symbolic");
        std::fs::remove_file(&reserve).expect("unlink");
    }
    // Without a link in the way, the reserve is made again.
    let outbox = Outbox::open(&dir, options).expect("open");
    let records = outbox.claim(2).expect("claim");
    assert_eq!(records.len(), 2);
    outbox.close().expect("close");
    let reserve = std::fs::symlink_metadata(dir.join("RESERVE")).expect("reserve");
    assert!(reserve.is_file() && reserve.len() > 0, "{reserve:?}");
}

/// A child made by `fork` inherits an open outbox but none of its threads,
/// and shares its lock: every call in the child fails with `Forked`, its
/// close and drop change nothing, and the parent's outbox, lock and records
/// are as they were.
#[test]
#[expect(
    unsafe_code,
    reason = "fork(2), waitpid(2) and _exit(2) have no wrapper in std"
)]
fn a_forked_child_cannot_use_its_parents_outbox_nor_release_its_lock() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let before = outbox.append(b"before the fork").expect("append");
    // SAFETY: the child calls only what the outbox's calls do (its appends
    // fail before they write), then `_exit`, never returning into the test
    // harness; the parent only waits for it.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let forked = |r: segwal::Result<()>| matches!(r, Err(Error::Forked));
        let answers = [
            forked(outbox.append(b"from the child").map(|_| ())),
            forked(outbox.claim(1).map(|_| ())),
            forked(outbox.ack(before)),
            forked(outbox.sync()),
            forked(outbox.clone().close()),
            forked(outbox.append(b"after close").map(|_| ())),
        ];
        drop(outbox);
        // The exit code names the first call that did not fail so (1 to 6).
        let code = answers.iter().position(|&f| !f).map_or(0, |k| k as i32 + 1);
        // SAFETY: ends the child at once, without the harness's exit path.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waits for the child just made; `status` outlives the call.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child's call {} did not fail with Forked",
        libc::WEXITSTATUS(status)
    );
    // The lock is still the parent's: another descriptor cannot take it.
    let probe = std::fs::File::open(&dir).expect("open the directory");
    assert!(matches!(
        probe.try_lock(),
        Err(std::fs::TryLockError::WouldBlock)
    ));
    let after = outbox.append(b"after the fork").expect("append");
    // A second child opens the directory for itself once the parent has
    // closed it: the parent's hold, copied into the child, is not its own.
    // SAFETY: as above.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let code = loop {
            match Outbox::open(&dir, Options::default()) {
                Ok(own) => break if own.close().is_ok() { 0 } else { 2 },
                Err(Error::Locked { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(_) => break 3,
            }
        };
        // SAFETY: as above.
        unsafe { libc::_exit(code) };
    }
    outbox.close().expect("close");
    // SAFETY: as above.
    let waited = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(waited, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the second child could not open the directory the parent closed: {}",
        libc::WEXITSTATUS(status)
    );
    let reopened = Outbox::open(&dir, Options::default()).expect("reopen");
    let records = crate::drain(&reopened);
    let got: Vec<(segwal::Seq, Vec<u8>)> = records
        .iter()
        .map(|r| (r.seq(), r.payload().to_vec()))
        .collect();
    assert_eq!(
        got,
        vec![
            (before, b"before the fork".to_vec()),
            (after, b"after the fork".to_vec())
        ]
    );
    reopened.close().expect("close");
}
