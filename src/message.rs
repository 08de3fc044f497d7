//! [`Message`]: a record with what its producer says about it — an ordering
//! key, a not-before time, a deduplication id — for
//! [`Outbox::append_message`](crate::Outbox::append_message).

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};
use crate::format::seq::Seq;

pub use crate::format::ext::{DEDUP_ID_BYTES_MAX, KEY_BYTES_MAX};

/// A record to append, and what its producer says about it. Borrows its
/// bytes: nothing is copied until the append has room in the writer queue.
///
/// ```
/// use std::time::Duration;
/// use segwal::Message;
///
/// let m = Message::new(b"{\"order\": 7781}")
///     .key(b"account-42")                  // delivered in order with the key's others
///     .delay(Duration::from_secs(30))      // not handed out for 30 s
///     .dedup_id(b"order-7781/created");    // appended at most once in the window
/// # let _ = m;
/// ```
#[derive(Clone, Debug)]
pub struct Message<'a> {
    pub(crate) payload: Cow<'a, [u8]>,
    pub(crate) key: Option<&'a [u8]>,
    pub(crate) not_before: Option<SystemTime>,
    pub(crate) dedup_id: Option<&'a [u8]>,
    pub(crate) unique: bool,
}

impl<'a> Message<'a> {
    /// A message of `payload`, with none of the optional fields: appended, it
    /// is what [`Outbox::append`](crate::Outbox::append) writes.
    pub fn new(payload: &'a [u8]) -> Message<'a> {
        Message {
            payload: Cow::Borrowed(payload),
            key: None,
            not_before: None,
            dedup_id: None,
            unique: false,
        }
    }

    /// The ordering key, 1 to [`KEY_BYTES_MAX`] (256) bytes: a record is not
    /// handed out while an earlier record with the same key is claimed,
    /// delayed, or still pending ahead of it (docs/GUARANTEES.md, section 8).
    pub fn key(mut self, key: &'a [u8]) -> Message<'a> {
        self.key = Some(key);
        self
    }

    /// Not handed out before `at` (the wall clock; docs/GUARANTEES.md, section 9,
    /// has the rule for a clock that steps). Kept in microseconds since the
    /// Unix epoch: a time before the epoch is kept as the epoch (no delay),
    /// one past `u64::MAX` microseconds after it (in the year 586,524) as
    /// that time (held for ever), and
    /// [`Record::not_before`](crate::Record::not_before) reads back what was
    /// kept.
    pub fn not_before(mut self, at: SystemTime) -> Message<'a> {
        self.not_before = Some(at);
        self
    }

    /// Not handed out before `delay` from now: [`not_before`](Message::not_before)
    /// of the wall clock plus `delay` (a delay past the year 586,524 is cut there).
    pub fn delay(self, delay: Duration) -> Message<'a> {
        let now = SystemTime::now();
        let at = now
            .checked_add(delay)
            .unwrap_or(SystemTime::UNIX_EPOCH + Duration::from_micros(u64::MAX));
        self.not_before(at)
    }

    /// The idempotency key, 1 to [`DEDUP_ID_BYTES_MAX`] (256) bytes: appended
    /// again within [`Options::dedup_window`](crate::Options::dedup_window) with
    /// the same payload, nothing is written and the answer names the first
    /// record ([`Appended::duplicate`]); with another payload, the append fails
    /// with [`Error::Conflict`].
    pub fn dedup_id(mut self, id: &'a [u8]) -> Message<'a> {
        self.dedup_id = Some(id);
        self
    }

    /// A unique item: its deduplication id is derived from its payload (a
    /// keyed digest), so appending bytes already appended within the window —
    /// pending, or recently delivered — is a duplicate. An explicit
    /// [`dedup_id`](Message::dedup_id) takes precedence.
    pub fn unique(mut self) -> Message<'a> {
        self.unique = true;
        self
    }

    /// A message whose payload is `value` serialised as JSON (feature
    /// `json`, on by default); [`Record::json`](crate::Record::json) reads it
    /// back. Fails with [`Error::Json`] if `value` cannot be serialised, or
    /// is nested more than 127 levels deep, which serde_json's reader refuses
    /// (also where the type read back would skip that part, as a
    /// `RawValue` or a skipped field does).
    ///
    /// Deduplication compares bytes: with a [`dedup_id`](Message::dedup_id)
    /// or [`unique`](Message::unique), two equal values must serialise to
    /// the same bytes, or the second is a [`Error::Conflict`] (or, unique,
    /// a second record). A `HashMap` does not: serde_json writes its entries
    /// in the map's own order, which differs from one map to the next. Use a
    /// `BTreeMap` or a struct. And serde_json writes a float that is NaN or
    /// infinite as `null`, which reads back as `null`, not as the float.
    ///
    /// ```
    /// # fn main() -> segwal::Result<()> {
    /// #[derive(serde::Serialize)]
    /// struct OrderCreated { order: u64 }
    ///
    /// let m = segwal::Message::json(&OrderCreated { order: 7781 })?.key(b"account-42");
    /// assert_eq!(m.payload(), br#"{"order":7781}"#);
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "json")]
    pub fn json<T: serde::Serialize + ?Sized>(value: &T) -> Result<Message<'static>> {
        let bytes = json_bytes(value)?;
        Ok(Message {
            payload: Cow::Owned(bytes),
            key: None,
            not_before: None,
            dedup_id: None,
            unique: false,
        })
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// Checks the fields' lengths.
    pub(crate) fn check(&self) -> Result<()> {
        let invalid = |field, len: usize, max: usize| {
            Err(Error::InvalidMessage {
                field,
                reason: format!("{len} bytes, outside 1..={max}"),
            })
        };
        if let Some(key) = self.key
            && !(1..=KEY_BYTES_MAX).contains(&key.len())
        {
            return invalid("key", key.len(), KEY_BYTES_MAX);
        }
        if let Some(id) = self.dedup_id
            && !(1..=DEDUP_ID_BYTES_MAX).contains(&id.len())
        {
            return invalid("dedup_id", id.len(), DEDUP_ID_BYTES_MAX);
        }
        Ok(())
    }
}

/// The outcome of an append of a [`Message`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    /// The record's sequence number; for a duplicate, the first record's.
    pub seq: Seq,
    /// Nothing was written: a record with the same deduplication id and the
    /// same payload was appended within the window.
    pub duplicate: bool,
}

/// The deepest nesting of arrays and objects serde_json reads back (its
/// reader stops at 128 levels).
#[cfg(feature = "json")]
const JSON_DEPTH_MAX: usize = 127;

/// `value` serialised as JSON, checked readable: serde_json writes values
/// nested deeper than its reader takes, which would make a record no relay
/// can read back. Refused with [`Error::Json`] instead.
#[cfg(feature = "json")]
pub(crate) fn json_bytes<T: serde::Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    let bytes = serde_json::to_vec(value).map_err(|e| Error::Json {
        seq: None,
        reason: crate::error::json_reason(&e),
    })?;
    let depth = json_depth(&bytes);
    if depth > JSON_DEPTH_MAX {
        return Err(Error::Json {
            seq: None,
            reason: format!(
                "nested {depth} levels deep, past the {JSON_DEPTH_MAX} a JSON reader takes"
            ),
        });
    }
    Ok(bytes)
}

/// The deepest nesting of arrays and objects in `json` (valid JSON, as
/// serde_json wrote it): one pass over the bytes, strings skipped.
#[cfg(feature = "json")]
fn json_depth(json: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in json {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[cfg(all(test, feature = "json"))]
mod tests {
    use super::*;

    #[test]
    fn the_depth_of_json_skips_brackets_inside_strings() {
        assert_eq!(json_depth(b"1"), 0);
        assert_eq!(json_depth(br#"{"a":[1,{"b":[]}]}"#), 4);
        assert_eq!(json_depth(br#"["[[[[", "\"[[", {"k]}": "\\"}]"#), 2);
        assert_eq!(json_depth(br#"[[],[[]],[]]"#), 3);
    }
}
