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
//! instead of naming each: a field added to `Stats` is exported without a
//! change here. Durations arrive as microseconds and are exported in
//! seconds, as Prometheus names them; `null` (no value yet) is left out.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;

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
                // One client that goes away mid-request ends its own
                // connection, not the exporter.
                if let Err(e) = stream.and_then(|stream| answer(&stream, &outbox)) {
                    eprintln!("a scrape failed: {e}");
                }
            }
        }
    }
    outbox.close()?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// Answers one HTTP request on `stream`: the metrics at `/metrics`.
fn answer(mut stream: &std::net::TcpStream, outbox: &Outbox) -> std::io::Result<()> {
    let mut request_line = String::new();
    BufReader::new(stream).read_line(&mut request_line)?;
    let (status, body) = if request_line.starts_with("GET /metrics ") {
        ("200 OK", prometheus(&outbox.stats()))
    } else {
        ("404 Not Found", String::from("try /metrics\n"))
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}
