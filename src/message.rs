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
    /// has the rule for a clock that steps).
    pub fn not_before(mut self, at: SystemTime) -> Message<'a> {
        self.not_before = Some(at);
        self
    }

    /// Not handed out before `delay` from now: [`not_before`](Message::not_before)
    /// of the wall clock plus `delay` (a delay past the year 584,000 is cut there).
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
    /// back. Fails with [`Error::Json`] if `value` cannot be serialised.
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
        let bytes = serde_json::to_vec(value).map_err(|e| Error::Json {
            seq: None,
            reason: crate::error::json_reason(&e),
        })?;
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
