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
//! removes it.
//!
//! `Stats` serialises (feature `json`), so the exporter walks its fields
//! instead of naming each: a numeric or boolean field added to `Stats` is
//! exported without a change here, as a gauge unless it is named in
//! `COUNTERS`. Durations arrive as microseconds and are exported in
//! seconds, as Prometheus names them; `null` (no value yet) is left out.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::time::Duration;

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
            eprintln!(
                "serving http://{addr}/metrics (Ctrl-C stops, and leaves its outbox in {}: remove it then)",
                dir.display()
            );
            for stream in listener.incoming() {
                // Each client on a thread of its own, within its timeout: one
                // that stalls or goes away mid-request ends its own
                // connection, not the exporter or the next scrape.
                let stream = match stream {
                    Ok(stream) => stream,
                    Err(e) => {
                        eprintln!("a connection failed: {e}");
                        continue;
                    }
                };
                let outbox = outbox.clone();
                std::thread::spawn(move || {
                    if let Err(e) = answer(&stream, &outbox) {
                        eprintln!("a scrape failed: {e}");
                    }
                });
            }
        }
    }
    outbox.close()?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// How long a client may take to send its request or read the answer: one
/// that stalls gives up its connection, not the exporter's.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// The most bytes of request head read (request line and headers).
const HEAD_MAX: u64 = 16 << 10;

/// Answers one HTTP request on `stream`: the metrics at `/metrics` (`GET`,
/// or `HEAD` for the head alone; a query string is ignored).
fn answer(mut stream: &TcpStream, outbox: &Outbox) -> std::io::Result<()> {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut head = BufReader::new(Read::take(stream, HEAD_MAX));
    let mut request_line = String::new();
    head.read_line(&mut request_line)?;
    // The headers, up to the blank line: read, so that the answer does not
    // meet unread bytes (closing a socket with unread input resets it, and
    // the client may lose the answer).
    let mut line = String::new();
    while head.read_line(&mut line)? > 0 && !line.trim_end().is_empty() {
        line.clear();
    }
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
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    if method != "HEAD" {
        stream.write_all(body.as_bytes())?;
    }
    // The answer is sent; whatever the client still sends (a body) is read
    // and dropped until it closes, or the timeout ends it.
    stream.shutdown(Shutdown::Write)?;
    let _ = std::io::copy(&mut Read::take(stream, 1 << 20), &mut std::io::sink());
    Ok(())
}
