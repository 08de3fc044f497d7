//! The async API under tokio (multi-thread and current-thread) and under a
//! minimal executor (pollster): records arrive intact and once, waits are
//! woken (by the writer, by room in the queue, by a lease running out, by
//! close), and a future dropped at any point loses no record that was
//! answered and duplicates none.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use segwal::{Error, Message, Options, Outbox, Seq};

use crate::{drain, tmp};

fn payload(producer: u32, i: u32) -> Vec<u8> {
    format!("producer {producer} record {i}").into_bytes()
}

/// Every record of `outbox` after a reopen: payload -> seq, each at most once.
fn reopened_payloads(path: &std::path::Path) -> BTreeMap<Vec<u8>, Seq> {
    let outbox = Outbox::open(path, Options::default()).expect("reopen");
    let mut seen = BTreeMap::new();
    for r in drain(&outbox) {
        let before = seen.insert(r.payload().to_vec(), r.seq());
        assert!(before.is_none(), "record {:?} delivered twice", r.seq());
    }
    outbox.close().expect("close");
    seen
}

#[test]
fn futures_are_send() {
    fn send<T: Send>(_: &T) {}
    let (_d, path) = tmp();
    let outbox = Outbox::open(&path, Options::default()).expect("open");
    send(&outbox.append_async(b"x"));
    send(&outbox.append_message_async(&Message::new(b"x")));
    send(&outbox.claim_async(1));
    send(&outbox.claim_wait_async(1, Duration::ZERO));
    send(&outbox.sync_async());
    outbox.close().expect("close");
}

#[test]
fn many_tasks_on_a_multi_thread_runtime_append_in_order() {
    let (_d, path) = tmp();
    let outbox = Arc::new(Outbox::open(&path, Options::default()).expect("open"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("runtime");
    let answered: Vec<Vec<Seq>> = rt.block_on(async {
        let tasks: Vec<_> = (0..64u32)
            .map(|p| {
                let outbox = outbox.clone();
                tokio::spawn(async move {
                    let mut seqs = Vec::new();
                    for i in 0..100 {
                        seqs.push(outbox.append_async(&payload(p, i)).await.expect("append"));
                    }
                    seqs
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.push(t.await.expect("task"));
        }
        all
    });
    // Each task's records in the order it appended them.
    for seqs in &answered {
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    }
    let records = drain(&outbox);
    assert_eq!(records.len(), 6_400);
    let by_seq: BTreeMap<Seq, Vec<u8>> = records
        .iter()
        .map(|r| (r.seq(), r.payload().to_vec()))
        .collect();
    for (p, seqs) in answered.iter().enumerate() {
        for (i, seq) in seqs.iter().enumerate() {
            assert_eq!(by_seq[seq], payload(p as u32, i as u32));
        }
    }
    Arc::try_unwrap(outbox)
        .expect("one handle")
        .close()
        .expect("close");
}

#[test]
fn a_current_thread_runtime_is_never_blocked() {
    // One thread runs the relay's wait and the producers: an append or a
    // wait that blocked the thread would leave the other side never polled,
    // and the claim would time out empty.
    let (_d, path) = tmp();
    // A queue of two requests: producers wait for room, as futures.
    let options = Options::default().queue_capacity(2);
    let outbox = Arc::new(Outbox::open(&path, options).expect("open"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let delivered = rt.block_on(async {
        let relay = {
            let outbox = outbox.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                while got.len() < 400 {
                    let batch = outbox
                        .claim_wait_async(64, Duration::from_secs(30))
                        .await
                        .expect("claim");
                    assert!(!batch.is_empty(), "the wait was not woken by appends");
                    for r in &batch {
                        outbox.ack(r.seq()).expect("ack");
                    }
                    got.extend(batch.into_iter().map(|r| r.payload().to_vec()));
                }
                got
            })
        };
        let producers: Vec<_> = (0..8u32)
            .map(|p| {
                let outbox = outbox.clone();
                tokio::spawn(async move {
                    for i in 0..50 {
                        outbox.append_async(&payload(p, i)).await.expect("append");
                    }
                })
            })
            .collect();
        for p in producers {
            p.await.expect("producer");
        }
        relay.await.expect("relay")
    });
    let mut expected: Vec<Vec<u8>> = (0..8)
        .flat_map(|p| (0..50).map(move |i| payload(p, i)))
        .collect();
    let mut got = delivered;
    expected.sort();
    got.sort();
    assert_eq!(got, expected);
    assert_eq!(outbox.stats().pending, 0);
    Arc::try_unwrap(outbox)
        .expect("one handle")
        .close()
        .expect("close");
}

#[test]
fn a_minimal_executor_runs_every_method() {
    let (_d, path) = tmp();
    // A lease that outlasts the calls between the two claims on a loaded
    // machine, and that the wait below sits out.
    let outbox =
        Outbox::open(&path, Options::default().lease(Duration::from_millis(500))).expect("open");
    let seq = pollster::block_on(outbox.append_async(b"first")).expect("append");
    let m = Message::new(b"second").dedup_id(b"order-7781");
    let a = pollster::block_on(outbox.append_message_async(&m)).expect("append message");
    assert!(!a.duplicate);
    let again = pollster::block_on(outbox.append_message_async(&m)).expect("append again");
    assert!(again.duplicate);
    assert_eq!(again.seq, a.seq);
    pollster::block_on(outbox.sync_async()).expect("sync");

    let first = pollster::block_on(outbox.claim_async(1)).expect("claim");
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].seq(), seq);
    assert_eq!(first[0].attempt(), 1);
    let second = pollster::block_on(outbox.claim_async(10)).expect("claim");
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].payload(), b"second");
    outbox.ack(second[0].seq()).expect("ack");

    // Nothing claimable until the first record's lease runs out: the timer
    // wakes the wait, which hands it out again as a second attempt.
    let back = pollster::block_on(outbox.claim_wait_async(10, Duration::from_secs(30)))
        .expect("claim wait");
    assert_eq!(back.len(), 1, "the lease's end did not wake the wait");
    assert_eq!(back[0].seq(), seq);
    assert_eq!(back[0].attempt(), 2);
    outbox.ack(seq).expect("ack");

    // And a timeout with nothing to claim resolves empty.
    let none = pollster::block_on(outbox.claim_wait_async(10, Duration::from_millis(30)))
        .expect("claim wait");
    assert!(none.is_empty());
    outbox.close().expect("close");
}

#[test]
fn close_wakes_every_waiting_future() {
    let (_d, path) = tmp();
    let outbox = Arc::new(Outbox::open(&path, Options::default()).expect("open"));
    let waiter = {
        let outbox = outbox.clone();
        std::thread::spawn(move || {
            pollster::block_on(outbox.claim_wait_async(1, Duration::from_secs(3600)))
        })
    };
    // Give the wait time to park (if it has not, close still answers it).
    std::thread::sleep(Duration::from_millis(50));
    outbox.close().expect("close");
    match waiter.join().expect("waiter") {
        Err(Error::Closed) => {}
        other => panic!("expected Closed, got {other:?}"),
    }
    assert!(matches!(
        pollster::block_on(outbox.append_async(b"late")),
        Err(Error::Closed)
    ));
}

/// Polls `fut` `polls` times (with a waker that does nothing), then drops it;
/// its answer if one of the polls returned it.
fn poll_then_drop<F: Future>(fut: F, polls: u32) -> Option<F::Output> {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    for _ in 0..polls {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return Some(out);
        }
        std::thread::yield_now();
    }
    None
}

#[test]
fn dropping_append_futures_at_random_points_loses_no_answered_record() {
    let (_d, path) = tmp();
    // A small queue, so that some futures wait for room when dropped.
    let outbox = Outbox::open(&path, Options::default().queue_capacity(4)).expect("open");
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut answered = BTreeMap::new();
    let mut never_polled = Vec::new();
    let mut dropped = Vec::new();
    for i in 0..2_000u32 {
        let p = payload(0, i);
        let polls = (next() % 4) as u32;
        // One in four awaited to the end, the others dropped after 0 to 2
        // polls.
        let outcome = if polls == 3 {
            Some(pollster::block_on(outbox.append_async(&p)))
        } else {
            poll_then_drop(outbox.append_async(&p), polls)
        };
        match outcome {
            Some(Ok(seq)) => {
                answered.insert(p, seq);
            }
            Some(Err(e)) => panic!("append {i}: {e}"),
            None if polls == 0 => never_polled.push(p),
            None => dropped.push(p),
        }
    }
    // The writer finishes what it was given; then a reopen shows the log.
    outbox.close().expect("close");
    let found = reopened_payloads(&path);
    for (p, seq) in &answered {
        assert_eq!(found.get(p), Some(seq), "an answered record is missing");
    }
    for p in &never_polled {
        assert!(!found.contains_key(p), "a future never polled was written");
    }
    // Dropped after a poll: in doubt, so present or not (each once, checked
    // by `reopened_payloads`), and nothing else is in the log.
    let in_doubt_written = dropped.iter().filter(|p| found.contains_key(*p)).count();
    assert_eq!(found.len(), answered.len() + in_doubt_written);
    assert!(!answered.is_empty() && !never_polled.is_empty() && !dropped.is_empty());
}

#[test]
fn tokio_timeouts_cancel_appends_and_claims_without_loss() {
    let (_d, path) = tmp();
    let outbox = Arc::new(
        Outbox::open(&path, Options::default().lease(Duration::from_millis(200))).expect("open"),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let answered: Vec<(Vec<u8>, Seq)> = rt.block_on(async {
        let tasks: Vec<_> = (0..16u32)
            .map(|p| {
                let outbox = outbox.clone();
                tokio::spawn(async move {
                    let mut done = Vec::new();
                    for i in 0..100u32 {
                        // A few microseconds to a few hundred: some appends
                        // are cut off while queued, some before.
                        let budget = Duration::from_micros(u64::from((p * 37 + i * 11) % 400));
                        let body = payload(p, i);
                        if let Ok(r) =
                            tokio::time::timeout(budget, outbox.append_async(&body)).await
                        {
                            done.push((body, r.expect("append")));
                        }
                    }
                    done
                })
            })
            .collect();
        // A relay whose claims are also cut off at random points.
        let relay = {
            let outbox = outbox.clone();
            tokio::spawn(async move {
                for k in 0..200u64 {
                    let cut = Duration::from_micros(k * 13 % 500);
                    if let Ok(r) = tokio::time::timeout(
                        cut,
                        outbox.claim_wait_async(8, Duration::from_millis(5)),
                    )
                    .await
                    {
                        // Claimed, not acked: each comes back at the next open.
                        drop(r.expect("claim"));
                    }
                }
            })
        };
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("task"));
        }
        relay.await.expect("relay");
        all
    });
    Arc::try_unwrap(outbox)
        .expect("one handle")
        .close()
        .expect("close");
    let found = reopened_payloads(&path);
    for (p, seq) in &answered {
        assert_eq!(found.get(p), Some(seq), "an answered record is missing");
    }
    assert!(found.len() >= answered.len());
    assert!(found.len() <= 1_600);
}

/// A waker that counts nothing: its `Arc`'s count says whether the outbox
/// still holds it.
struct Held;

impl std::task::Wake for Held {
    fn wake(self: Arc<Self>) {}
}

/// A `claim_wait_async` future polled and then dropped, or run to its
/// timeout, leaves no waker behind on an idle outbox: ten thousand tasks
/// that gave up waiting cost nothing once they are gone.
#[test]
fn a_claim_wait_given_up_or_timed_out_leaves_no_waker_behind() {
    let (_d, path) = tmp();
    let outbox = Outbox::open(&path, Options::default()).expect("open");
    let held = Arc::new(Held);
    let waker = Waker::from(held.clone());
    let mut cx = Context::from_waker(&waker);
    for round in 0..10_000 {
        let mut wait = pin!(outbox.claim_wait_async(10, Duration::from_secs(3600)));
        assert!(wait.as_mut().poll(&mut cx).is_pending());
        assert!(Arc::strong_count(&held) > 2, "round {round}: registered");
    }
    assert_eq!(Arc::strong_count(&held), 2, "dropped futures' wakers kept");
    // Run to its timeout: nothing kept either.
    let none = pollster::block_on(outbox.claim_wait_async(10, Duration::from_millis(5)))
        .expect("claim_wait_async");
    assert!(none.is_empty());
    let mut wait = pin!(outbox.claim_wait_async(10, Duration::ZERO));
    match wait.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(records)) => assert!(records.is_empty()),
        other => panic!("{other:?}"),
    }
    assert_eq!(Arc::strong_count(&held), 2);
    // And a waiting future is still woken by an append.
    let mut wait = pin!(outbox.claim_wait_async(10, Duration::from_secs(3600)));
    assert!(wait.as_mut().poll(&mut cx).is_pending());
    let seq = outbox.append(b"arrives").expect("append");
    let got = pollster::block_on(wait).expect("claim_wait_async");
    assert_eq!(got[0].seq(), seq);
    outbox.close().expect("close");
}

/// A waker that owns the last handle, and drops it when woken.
struct DropsTheOutbox(std::sync::Mutex<Option<Outbox>>);

impl std::task::Wake for DropsTheOutbox {
    fn wake(self: Arc<Self>) {
        drop(self.0.lock().expect("waker's handle").take());
    }
}

/// A waker run by segwal's own thread (the writer's, or the notifier's for
/// batches of many answers) that drops the last handle closes the outbox
/// without waiting for that thread: what was queued is written, the lock
/// goes, and the directory opens again (it deadlocked with the notifier).
#[test]
fn a_waker_that_drops_the_last_handle_closes_the_outbox_without_hanging() {
    for appends in [1usize, 100] {
        let (_d, path) = tmp();
        let options = Options::default()
            .caller_writes(false)
            .linger(Duration::from_millis(50));
        let outbox = Outbox::open(&path, options).expect("open");
        let owner = Arc::new(DropsTheOutbox(std::sync::Mutex::new(Some(outbox.clone()))));
        let waker = Waker::from(owner.clone());
        {
            let mut futures: Vec<_> = (0..appends)
                .map(|_| Box::pin(outbox.append_async(b"queued")))
                .collect();
            for (k, future) in futures.iter_mut().enumerate() {
                // Only the last future's waker owns the handle.
                let mut cx = if k + 1 == appends {
                    Context::from_waker(&waker)
                } else {
                    Context::from_waker(Waker::noop())
                };
                assert!(future.as_mut().poll(&mut cx).is_pending());
            }
        }
        drop((outbox, waker, owner));
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let reopened = loop {
            match Outbox::open(&path, Options::default()) {
                Ok(outbox) => break outbox,
                Err(Error::Locked { .. }) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("{appends} appends: the directory stayed held: {e}"),
            }
        };
        assert_eq!(drain(&reopened).len(), appends);
        reopened.close().expect("close");
    }
}

/// A waker that, run by segwal's notifier thread, acknowledges records one
/// chunk after another under `ack_durability(Sync)`.
struct AcksWhenWoken {
    outbox: std::sync::Mutex<Option<Outbox>>,
    seqs: Vec<Seq>,
    started: std::sync::atomic::AtomicBool,
}

impl std::task::Wake for AcksWhenWoken {
    fn wake(self: Arc<Self>) {
        let Some(outbox) = self.outbox.lock().expect("waker's handle").take() else {
            return;
        };
        self.started
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for chunk in self.seqs.chunks(500) {
            if outbox.ack_many(chunk).is_err() {
                break;
            }
        }
    }
}

/// A change made on segwal's own thread while a close runs on another must
/// not wait for that close: the close's writer joins the notifier thread as
/// it stops, so such a wait would hold all three for ever.
#[test]
fn a_change_made_by_a_waker_while_close_runs_does_not_wait_for_the_close() {
    let options = Options::default()
        .ack_durability(segwal::Durability::Sync)
        .caller_writes(false)
        .linger(Duration::from_millis(50));
    for round in 0..10u64 {
        let (_d, path) = tmp();
        let outbox = Outbox::open(&path, options.clone()).expect("open");
        let payloads: Vec<[u8; 4]> = (0..20_000u32).map(|i| i.to_le_bytes()).collect();
        outbox.append_batch(&payloads).expect("append");
        let seqs: Vec<Seq> = drain(&outbox).iter().map(|r| r.seq()).collect();
        let acker = Arc::new(AcksWhenWoken {
            outbox: std::sync::Mutex::new(Some(outbox.clone())),
            seqs,
            started: std::sync::atomic::AtomicBool::new(false),
        });
        let waker = Waker::from(acker.clone());
        // A batch of more answers than the writer wakes itself: the
        // notifier thread wakes them, the last with the acknowledging waker.
        let mut futures: Vec<_> = (0..100)
            .map(|_| Box::pin(outbox.append_async(b"x")))
            .collect();
        let last = futures.len() - 1;
        for (k, future) in futures.iter_mut().enumerate() {
            let w = if k == last { &waker } else { Waker::noop() };
            assert!(
                future
                    .as_mut()
                    .poll(&mut Context::from_waker(w))
                    .is_pending()
            );
        }
        while !acker.started.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_micros(300 + round * 400));
        let (done, closed) = std::sync::mpsc::channel();
        let closer = outbox.clone();
        std::thread::spawn(move || done.send(closer.close()));
        let answer = closed
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("round {round}: close still waits after 60 s"));
        answer.expect("close");
        drop(futures);
    }
}
