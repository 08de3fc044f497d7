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
