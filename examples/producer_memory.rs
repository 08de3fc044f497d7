//! Memory per deduplication id and per ordering key, measured as the growth of
//! the process's resident memory (each case in a child process of its own,
//! against a child that appends the same records without ids or keys), and
//! as segwal's own accounting (`Stats::state_bytes`).
//!
//! ```sh
//! cargo run --release --example producer_memory            # 1,000,000 records
//! cargo run --release --example producer_memory -- 200000   # fewer
//! ```

use std::process::Command;

use segwal::{Durability, Message, Options, Outbox};

/// Resident memory of this process, in bytes (Linux: /proc/self/statm).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Appends `n` records as the case says and prints the growth of resident
/// memory and of `state_bytes` as `rss state`.
fn child(case: &str, n: u64) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let options = Options::default()
        .durability(Durability::Buffered)
        .dedup_capacity(n as usize)
        .min_free_disk_bytes(0);
    let outbox = Outbox::open(dir.path().join("o"), options).expect("open");
    let before = (rss(), outbox.stats().state_bytes);
    let payload = [7u8; 64];
    let mut done = 0u64;
    while done < n {
        let k = (n - done).min(1024) as usize;
        let names: Vec<String> = (0..k)
            .map(|i| match case {
                "dedup" => format!("order-{:09}/created", done + i as u64),
                // Two records per key: one out, one held back behind it.
                "keys" => format!("account-{:09}", (done + i as u64) / 2),
                _ => String::new(),
            })
            .collect();
        let messages: Vec<Message<'_>> = names
            .iter()
            .map(|name| match case {
                "dedup" => Message::new(&payload).dedup_id(name.as_bytes()),
                "keys" => Message::new(&payload).key(name.as_bytes()),
                _ => Message::new(&payload),
            })
            .collect();
        outbox.append_messages(&messages).expect("append");
        done += k as u64;
    }
    outbox.sync().expect("sync");
    let stats = outbox.stats();
    if case == "keys" {
        assert_eq!(stats.blocked_keys, n / 2);
    }
    if case == "dedup" {
        assert_eq!(stats.dedup_ids, n);
    }
    println!(
        "{} {}",
        rss().saturating_sub(before.0),
        stats.state_bytes.saturating_sub(before.1)
    );
    outbox.close().expect("close");
}

fn measure(case: &str, n: u64) -> (f64, f64) {
    let me = std::env::current_exe().expect("current exe");
    let out = Command::new(me)
        .args(["--child", case, &n.to_string()])
        .output()
        .expect("run child");
    assert!(
        out.status.success(),
        "{case}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text
        .split_whitespace()
        .map(|v| v.parse::<f64>().unwrap_or(0.0));
    (it.next().unwrap_or(0.0), it.next().unwrap_or(0.0))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        let n = args
            .get(3)
            .and_then(|v| v.parse().ok())
            .unwrap_or(1_000_000);
        child(args.get(2).map_or("plain", String::as_str), n);
        return;
    }
    let n: u64 = match args.get(1).map(|v| v.parse::<u64>()) {
        None => 1_000_000,
        // Fewer records than this measure the allocator, not the records.
        Some(Ok(n)) if n >= 10_000 => n,
        Some(_) => {
            eprintln!("usage: producer_memory [RECORDS] (at least 10,000; default 1,000,000)");
            std::process::exit(2);
        }
    };
    let plain = measure("plain", n);
    let dedup = measure("dedup", n);
    let keys = measure("keys", n);
    println!("{n} records of 64 B, each case in a fresh process:");
    println!(
        "  no ids or keys: resident +{:.1} MiB, state_bytes +{:.1} MiB",
        plain.0 / 1048576.0,
        plain.1 / 1048576.0
    );
    println!(
        "  a dedup id each: {:.1} bytes per id resident ({:.1} by state_bytes)",
        (dedup.0 - plain.0) / n as f64,
        (dedup.1 - plain.1) / n as f64
    );
    println!(
        "  two records per key ({} keys blocked): {:.1} bytes per blocked key resident ({:.1} by state_bytes)",
        n / 2,
        (keys.0 - plain.0) / (n / 2) as f64,
        (keys.1 - plain.1) / (n / 2) as f64
    );
}
