//! The service under test, run as a child process of the tests (this test
//! binary with the argument `service`): producer threads append a known
//! workload to an outbox while a relay publishes it into JetStream; killed
//! and restarted by the tests, it carries on where it was, and it exits 0
//! once every record is appended and acknowledged.
//!
//! Restarting producers cannot know which of their last appends were durable
//! when the process was killed: each producer records how far it got (after
//! its appends returned) in a progress file outside the outbox, appends again
//! from there, and every record carries a dedup id, so an append made twice
//! is one record (`Appended::duplicate`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use segwal::nats::{JetStream, JetStreamOptions};
use segwal::{Message, Options, Outbox, Outcome, Publisher, Record, Relay, RelayOptions};

/// The subject template of the tests' streams.
pub const SUBJECT: &str = "segwal.test.{key}";

/// What the service runs.
#[derive(Clone, Debug)]
pub struct Workload {
    pub dir: PathBuf,
    pub servers: String,
    pub stream: String,
    pub replicas: usize,
    pub producers: usize,
    pub per_producer: usize,
}

/// Keys per producer: records of one key go one at a time, so the relay's
/// rounds hold at most this many records of each producer.
const KEYS_PER_PRODUCER: usize = 16;

/// The payload of producer `p`'s `i`-th record: 256 bytes, checkable.
pub fn payload(p: usize, i: usize) -> Vec<u8> {
    let mut bytes = format!("p{p} i{i} ").into_bytes();
    let mut x = (p as u64) << 32 | i as u64 | 1;
    while bytes.len() < 256 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        bytes.push(b'a' + (x % 26) as u8);
    }
    bytes
}

/// The ordering key of producer `p`'s `i`-th record.
pub fn key(p: usize, i: usize) -> String {
    format!("p{p}-k{}", i % KEYS_PER_PRODUCER)
}

/// Producer and index of a payload made by [`payload`].
pub fn parse(payload: &[u8]) -> Option<(usize, usize)> {
    let text = std::str::from_utf8(payload).ok()?;
    let mut words = text.split(' ');
    let p = words.next()?.strip_prefix('p')?.parse().ok()?;
    let i = words.next()?.strip_prefix('i')?.parse().ok()?;
    Some((p, i))
}

impl Workload {
    fn outbox_dir(&self) -> PathBuf {
        self.dir.join("outbox")
    }

    fn progress(&self, p: usize) -> PathBuf {
        self.dir.join(format!("progress-{p}"))
    }

    /// The options the service and the tests open the outbox with.
    pub fn options() -> Options {
        Options::default().segment_bytes(4 << 20)
    }

    /// Opens the outbox (after the service exited).
    pub fn open(&self) -> Outbox {
        Outbox::open(self.outbox_dir(), Workload::options()).expect("the outbox opens")
    }

    /// The publisher options of the service.
    pub fn publisher(&self) -> JetStreamOptions {
        JetStreamOptions::new(&self.servers, &self.stream, SUBJECT)
            .create_stream(self.replicas)
            .timeout(Duration::from_secs(2))
    }

    /// Starts the service as a child process.
    pub fn spawn(&self) -> Child {
        let exe = std::env::current_exe().expect("the test binary");
        let mut command = Command::new(exe);
        crate::server::die_with_parent(&mut command);
        command
            .arg("service")
            .arg(&self.dir)
            .arg(&self.servers)
            .arg(&self.stream)
            .arg(self.replicas.to_string())
            .arg(self.producers.to_string())
            .arg(self.per_producer.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the service starts")
    }

    fn from_args(args: &[String]) -> Workload {
        assert_eq!(
            args.len(),
            6,
            "service DIR SERVERS STREAM REPLICAS PRODUCERS PER_PRODUCER"
        );
        Workload {
            dir: PathBuf::from(&args[0]),
            servers: args[1].clone(),
            stream: args[2].clone(),
            replicas: args[3].parse().expect("replicas"),
            producers: args[4].parse().expect("producers"),
            per_producer: args[5].parse().expect("records per producer"),
        }
    }
}

fn read_progress(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

fn write_progress(path: &Path, done: usize) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, done.to_string()).expect("progress file");
    std::fs::rename(&tmp, path).expect("progress file");
}

/// The service's publisher: JetStream's, keeping the reason of the last
/// retry it answered, which the service's progress lines print (a run that
/// stalls says why the broker would not take its records).
struct Noting {
    inner: JetStream,
    last_retry: Arc<Mutex<Option<(Instant, String)>>>,
}

impl Publisher for Noting {
    fn publish(&mut self, records: &[Record]) -> Vec<Outcome> {
        let outcomes = self.inner.publish(records);
        if let Some(Outcome::Retry(reason)) =
            outcomes.iter().find(|o| matches!(o, Outcome::Retry(_)))
        {
            *self.last_retry.lock() = Some((Instant::now(), reason.clone()));
        }
        outcomes
    }
}

/// The child process's main: exits 0 when everything is delivered.
pub fn main(args: &[String]) {
    let work = Workload::from_args(args);
    let outbox = work.open();
    let last_retry = Arc::new(Mutex::new(None));
    let publisher = Noting {
        inner: JetStream::connect(&outbox, work.publisher()).expect("publisher"),
        last_retry: last_retry.clone(),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let relay = {
        let (outbox, stop) = (outbox.clone(), stop.clone());
        thread::spawn(move || {
            let options =
                RelayOptions::default().backoff(Duration::from_millis(50), Duration::from_secs(2));
            let mut relay = Relay::new(outbox, publisher, options);
            relay.run(&stop).expect("the relay runs")
        })
    };
    // Every 30 s, where delivery stands: a run that stalls says whether
    // appends or publishing stopped.
    let monitor = {
        let (outbox, stop) = (outbox.clone(), stop.clone());
        thread::spawn(move || {
            let started = Instant::now();
            let mut next = started + Duration::from_secs(30);
            while !stop.load(Ordering::Acquire) {
                thread::sleep(Duration::from_millis(100));
                if Instant::now() >= next {
                    next += Duration::from_secs(30);
                    let s = outbox.stats();
                    let retry = match &*last_retry.lock() {
                        Some((at, why)) => {
                            format!(
                                "; last retry {:.1} s ago: {why}",
                                at.elapsed().as_secs_f64()
                            )
                        }
                        None => String::new(),
                    };
                    eprintln!(
                        "service: at {:.0} s, last seq {:?}, pending {}, claimed {}, delayed {}{retry}",
                        started.elapsed().as_secs_f64(),
                        s.last_seq,
                        s.pending,
                        s.claimed,
                        s.delayed
                    );
                }
            }
        })
    };
    let producers: Vec<_> = (0..work.producers)
        .map(|p| {
            let (outbox, work) = (outbox.clone(), work.clone());
            thread::spawn(move || {
                let path = work.progress(p);
                let from = read_progress(&path);
                for i in from..work.per_producer {
                    let (payload, key, id) = (payload(p, i), key(p, i), format!("p{p}-{i}"));
                    let message = Message::new(&payload)
                        .key(key.as_bytes())
                        .dedup_id(id.as_bytes());
                    outbox.append_message(&message).expect("append");
                    if i % 500 == 499 {
                        write_progress(&path, i + 1);
                    }
                }
                write_progress(&path, work.per_producer);
            })
        })
        .collect();
    for producer in producers {
        producer.join().expect("producer");
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let stats = outbox.stats();
        assert_eq!(stats.dead_letters, 0, "no record may become a dead letter");
        if stats.pending == 0 && stats.claimed == 0 && stats.delayed == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not delivered in time: {stats:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Release);
    let figures = relay.join().expect("relay");
    monitor.join().expect("monitor");
    outbox.close().expect("close");
    eprintln!("service: done, {figures:?}");
}
