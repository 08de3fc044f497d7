//! `Outbox::stats()` as Prometheus text, the exposition format a scraper
//! reads from a service's `/metrics` (format 0.0.4: `# HELP`, `# TYPE`, one
//! `name value` line per metric).
//!
//! ```text
//! cargo run --example prometheus                      # prints once and exits
//! cargo run --example prometheus -- 127.0.0.1:9187    # serves GET /metrics
//! ```
//!
//! Serving, it runs until it is stopped (Ctrl-C), which leaves its outbox in
//! the temporary directory it names when it starts; printing once, it
//! removes it. It answers up to 32 connections at once, each on a thread of
//! its own and within 5 s of its accept; more are closed unanswered, so a
//! flood of idle connections costs a scrape, not the exporter.
//!
//! `Stats` serialises (feature `json`), so the exporter walks its fields
//! instead of naming each: a numeric or boolean field added to `Stats` is
//! exported without a change here, as a gauge unless it is named in
//! `COUNTERS`. Durations arrive as microseconds and are exported in
//! seconds, as Prometheus names them; `null` (no value yet) is left out.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use segwal::{Options, Outbox, Stats};

/// Counters only grow while the outbox is open; every other field is a gauge.
const COUNTERS: &[&str] = &[
    "records_appended",
    "batches",
    "caller_batches",
    "fsyncs",
    "segments_deleted",
    "segments_recycled",
    "relocated",
    "corrupt_records",
    "claimed_expired",
    "duplicates",
];

/// The text a scraper reads.
fn prometheus(stats: &Stats) -> String {
    let value = serde_json::to_value(stats).expect("Stats serialises");
    let mut out = String::new();
    let Some(fields) = value.as_object() else {
        return out;
    };
    for (field, v) in fields {
        let (name, number) = match (field.strip_suffix("_us"), v) {
            (Some(base), serde_json::Value::Number(n)) => (
                format!("segwal_{base}_seconds"),
                n.as_f64().unwrap_or(0.0) / 1e6,
            ),
            (None, serde_json::Value::Number(n)) => {
                (format!("segwal_{field}"), n.as_f64().unwrap_or(0.0))
            }
            (None, serde_json::Value::Bool(b)) => {
                (format!("segwal_{field}"), f64::from(u8::from(*b)))
            }
            // null: nothing measured yet.
            _ => continue,
        };
        let (name, kind) = if COUNTERS.contains(&field.as_str()) {
            (format!("{name}_total"), "counter")
        } else {
            (name, "gauge")
        };
        out.push_str(&format!(
            "# HELP {name} segwal Stats::{field}\n# TYPE {name} {kind}\n{name} {number}\n"
        ));
    }
    out
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("segwal-prometheus-{}", std::process::id()));
    let outbox = Outbox::open(&dir, Options::default())?;
    for i in 0..1_000u32 {
        outbox.append(format!("event {i}").as_bytes())?;
    }
    let batch = outbox.claim(100)?;
    if let Some(last) = batch.last() {
        outbox.ack_through(last.seq())?;
    }

    match std::env::args().nth(1) {
        None => print!("{}", prometheus(&outbox.stats())),
        Some(addr) => {
            let listener = match TcpListener::bind(&addr) {
                Ok(listener) => listener,
                Err(e) => {
                    outbox.close()?;
                    std::fs::remove_dir_all(&dir)?;
                    return Err(format!("listen on {addr}: {e}").into());
                }
            };
            log(format_args!(
                "serving http://{addr}/metrics (Ctrl-C stops, and leaves its outbox in {}: remove it then)",
                dir.display()
            ));
            serve(&listener, &outbox);
        }
    }
    outbox.close()?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// How long a connection may last, from its accept to its end: a client
/// that stalls, or sends a byte now and then, gives up its connection, not
/// the exporter's.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// The most bytes of request head read (request line and headers).
const HEAD_MAX: u64 = 16 << 10;
/// The most connections answered at once; more are closed unanswered.
const CONNECTIONS_MAX: usize = 32;

/// Accepts connections for ever, each answered on a thread of its own.
fn serve(listener: &TcpListener, outbox: &Outbox) {
    let live = Arc::new(AtomicUsize::new(0));
    let mut failing = false;
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(stream) => stream,
            Err(e) => {
                // Out of descriptors, say: said once, then a pause before
                // the next accept rather than a busy loop.
                if !failing {
                    log(format_args!(
                        "accepting a connection failed: {e} (said once until one succeeds)"
                    ));
                }
                failing = true;
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        failing = false;
        let Some(slot) = Slot::take(&live) else {
            continue; // dropped: closed unanswered
        };
        let outbox = outbox.clone();
        let spawned = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                // Given back however the thread ends, a panic included.
                let _slot = slot;
                if let Err(e) = answer(&stream, &outbox) {
                    log(format_args!("a scrape failed: {e}"));
                }
            });
        if let Err(e) = spawned {
            // The system refused a thread: this connection goes unanswered
            // (closed, and its slot given back, as the closure drops), the
            // exporter goes on.
            log(format_args!("no thread for a connection: {e}"));
        }
    }
}

/// A line on stderr, or nothing if stderr is gone (where `eprintln!` would
/// panic).
fn log(line: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// One of the [`CONNECTIONS_MAX`] connections answered at once.
struct Slot(Arc<AtomicUsize>);

impl Slot {
    fn take(live: &Arc<AtomicUsize>) -> Option<Slot> {
        if live.fetch_add(1, Ordering::SeqCst) >= CONNECTIONS_MAX {
            live.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Slot(live.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The client's side of a connection, every read of which ends by the
/// connection's deadline: a client sending a byte now and then cannot
/// stretch it.
struct Deadlined<'a> {
    stream: &'a TcpStream,
    deadline: Instant,
}

impl Read for Deadlined<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        let mut stream = self.stream;
        stream.read(buf)
    }
}

/// Answers one HTTP request on `stream`: the metrics at `/metrics` (`GET`,
/// or `HEAD` for the head alone; a query string is ignored), all within
/// [`CLIENT_TIMEOUT`] of the accept.
fn answer(mut stream: &TcpStream, outbox: &Outbox) -> std::io::Result<()> {
    let mut client = Deadlined {
        stream,
        deadline: Instant::now() + CLIENT_TIMEOUT,
    };
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut head = BufReader::new(Read::take(&mut client, HEAD_MAX));
    let mut request_line = Vec::new();
    head.read_until(b'\n', &mut request_line)?;
    if request_line.is_empty() {
        return Ok(()); // connected and closed (a health check): nothing to answer
    }
    // The headers, up to the blank line, as bytes (HTTP lets them hold any
    // byte): read, so that the answer does not meet unread bytes (closing a
    // socket with unread input resets it, and the client may lose the
    // answer).
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = head.read_until(b'\n', &mut line)?;
        if n == 0 || line.trim_ascii().is_empty() {
            break;
        }
    }
    drop(head);
    let request_line = String::from_utf8_lossy(&request_line);
    let mut words = request_line.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => ("200 OK", prometheus(&outbox.stats())),
        ("GET" | "HEAD", _) => ("404 Not Found", String::from("try /metrics\n")),
        _ => ("405 Method Not Allowed", String::from("GET /metrics\n")),
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nAllow: GET, HEAD\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    if method != "HEAD" {
        stream.write_all(body.as_bytes())?;
    }
    // The answer is sent; whatever the client still sends (a body) is read
    // and dropped until it closes, or the deadline ends it.
    stream.shutdown(Shutdown::Write)?;
    let _ = std::io::copy(&mut client, &mut std::io::sink());
    Ok(())
}
