//! Typed records: `append_json`, `Message::json`, `Record::json`.

use std::collections::BTreeMap;

use segwal::{Error, Message, Options, Outbox};
use serde::{Deserialize, Serialize};

use crate::tmp;

#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct OrderCreated {
    order: u64,
    account: String,
    lines: Vec<(String, u32)>,
}

#[derive(Deserialize, Debug)]
struct Other {
    #[allow(dead_code, reason = "decoded only to fail")]
    url: String,
}

fn order(n: u64) -> OrderCreated {
    OrderCreated {
        order: n,
        account: format!("account-{}", n % 3),
        lines: vec![("book".into(), 2), ("pen \"blue\"".into(), 1)],
    }
}

#[test]
fn typed_records_round_trip_through_appends_messages_and_a_reopen() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let a = outbox.append_json(&order(1)).expect("append_json");
    let m = Message::json(&order(2))
        .expect("json")
        .key(b"account-2")
        .dedup_id(b"order-2/created");
    let b = outbox.append_message(&m).expect("append_message");
    assert!(outbox.append_message(&m).expect("again").duplicate);
    outbox.close().expect("close");
    let outbox = Outbox::open(&dir, Options::default()).expect("reopen");
    let got = outbox.claim(10).expect("claim");
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].seq(), a);
    assert_eq!(got[0].json::<OrderCreated>().expect("decode"), order(1));
    assert_eq!(got[1].seq(), b.seq);
    assert_eq!(got[1].json::<OrderCreated>().expect("decode"), order(2));
    assert_eq!(got[1].key(), Some(&b"account-2"[..]));
    outbox.close().expect("close");
}

#[test]
fn a_payload_of_another_type_is_a_typed_error_naming_the_seq() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let seq = outbox.append_json(&order(7)).expect("append_json");
    let raw = outbox.append(b"not json at all").expect("append");
    let got = outbox.claim(10).expect("claim");
    match got[0].json::<Other>() {
        Err(Error::Json {
            seq: Some(s),
            reason,
        }) => {
            assert_eq!(s, seq);
            assert!(reason.contains("url"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        got[1].json::<OrderCreated>(),
        Err(Error::Json { seq: Some(s), .. }) if s == raw
    ));
    outbox.close().expect("close");
}

/// serde's message may quote the payload: the error keeps its start only,
/// so that a record of megabytes does not become an error (and a log line)
/// of megabytes.
#[test]
fn a_json_error_quotes_at_most_the_start_of_the_payload() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let big = format!("\"{}\"", "é".repeat(1 << 20));
    outbox.append(big.as_bytes()).expect("append");
    let got = outbox.claim(1).expect("claim");
    match got[0].json::<OrderCreated>() {
        Err(Error::Json { reason, .. }) => {
            assert!(
                reason.len() <= segwal::JSON_REASON_MAX,
                "{} bytes",
                reason.len()
            );
            // Cut in the middle: serde_json's "at line L column C" is kept.
            assert!(reason.contains('…'), "{reason}");
            assert!(reason.contains("… at line 1 column "), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    outbox.close().expect("close");
}

/// `value` is refused by `append_json` and `Message::json` alike, with a
/// serialising error (no seq), and the outbox has written nothing.
fn refused_writing_nothing<T: Serialize + ?Sized>(outbox: &Outbox, value: &T) {
    assert!(matches!(
        outbox.append_json(value),
        Err(Error::Json { seq: None, .. })
    ));
    assert!(matches!(
        Message::json(value),
        Err(Error::Json { seq: None, .. })
    ));
    assert_eq!(outbox.stats().records_appended, 0);
}

#[test]
fn a_value_that_cannot_be_json_writes_nothing() {
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    // JSON objects have string keys only.
    let mut bad: BTreeMap<(u8, u8), u8> = BTreeMap::new();
    bad.insert((1, 2), 3);
    refused_writing_nothing(&outbox, &bad);
    outbox.close().expect("close");
}

#[test]
fn a_value_too_deep_to_read_back_writes_nothing() {
    // serde_json writes values nested more than 127 levels deep, which its
    // reader refuses: such a record could never be read back by a relay.
    let (_t, dir) = tmp();
    let outbox = Outbox::open(&dir, Options::default()).expect("open");
    let nested =
        |depth: usize| (0..depth).fold(serde_json::json!(1), |v, _| serde_json::json!([v]));
    let deep = nested(200);
    refused_writing_nothing(&outbox, &deep);
    // 127 levels read back; 128 do not.
    assert!(outbox.append_json(&nested(128)).is_err());
    let fine = nested(127);
    outbox.append_json(&fine).expect("append");
    let got = outbox.claim(1).expect("claim");
    assert_eq!(
        got[0].json::<serde_json::Value>().expect("reads back"),
        fine
    );
    outbox.close().expect("close");
}

#[test]
fn stats_serialise_with_fsync_percentiles() {
    let (_d, path) = tmp();
    let outbox = Outbox::open(&path, Options::default()).expect("open");
    let before = outbox.stats();
    assert_eq!(before.fsync_p50, None, "no batch fsync yet");
    for i in 0..50u32 {
        outbox.append(&i.to_le_bytes()).expect("append");
    }
    let claimed = outbox.claim(10).expect("claim");
    outbox.ack(claimed[0].seq()).expect("ack");
    let stats = outbox.stats();
    let (p50, p99, max) = (
        stats.fsync_p50.expect("p50"),
        stats.fsync_p99.expect("p99"),
        stats.fsync_max.expect("max"),
    );
    assert!(p50 <= p99 && p99 <= max, "{p50:?} {p99:?} {max:?}");
    assert!(p50 > std::time::Duration::ZERO);

    let json = serde_json::to_value(&stats).expect("serialise");
    assert_eq!(json["pending"], 40);
    assert_eq!(json["claimed"], 9);
    assert_eq!(json["records_appended"], 50);
    assert_eq!(json["first_seq"], claimed[1].seq().get());
    assert_eq!(
        json["fsync_max_us"],
        u64::try_from(max.as_micros()).expect("fits")
    );
    assert!(json["oldest_pending_age_us"].is_u64());
    assert_eq!(json["poisoned"], false);
    // Every field a number, a boolean or null: what a metrics exporter reads.
    let fields = json.as_object().expect("an object");
    assert!(fields.len() >= 33, "{} fields", fields.len());
    for (name, value) in fields {
        assert!(
            value.is_number() || value.is_boolean() || value.is_null(),
            "{name}: {value}"
        );
    }
    outbox.close().expect("close");
}
