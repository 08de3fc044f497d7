//! A [`Publisher`] into NATS JetStream (feature `nats`): [`JetStream`].
//!
//! Every record becomes one message on a subject made from a template (fixed,
//! or with the record's key in it), with four headers: `Nats-Msg-Id`, the
//! outbox's identity and the record's seq (`<32 hex digits>-<seq>`), which
//! JetStream deduplicates within the stream's duplicate window,
//! `Segwal-Seq`, the seq alone, `Segwal-Crc32`, the CRC-32 of the
//! payload (eight hex digits), and `Nats-Expected-Stream`, the stream, so
//! that a subject another stream captures is refused, not stored there. A
//! batch is published pipelined on one connection (up to
//! [`JetStreamOptions::in_flight`] acknowledgements outstanding) and each
//! record's outcome comes from its own `PubAck`: only one from the stream,
//! with a sequence, settles a record (a 2.10 cluster answers a publish it
//! is still storing as a duplicate at sequence 0; docs/RELAY.md, "A
//! duplicate that is not one"). A stream that would acknowledge what it
//! does not keep (`interest` retention, no consumer's filter matching the
//! subject) or answer nothing (`no_ack`) gets no publish of such a record:
//! it is retried, saying why.
//!
//! Beyond the duplicate window, deduplication is this publisher's: before its
//! first publish it reads the last [`JetStreamOptions::reconcile_depth`]
//! messages of the stream and answers [`Outcome::Duplicate`], without
//! publishing, for every record of this outbox already among them with the
//! same payload checksum (its id, its `Segwal-Seq` and its `Segwal-Crc32`
//! agreeing): the records a crash left stored in the stream but not
//! acknowledged in the outbox (docs/RELAY.md, "records in doubt").
//!
//! The client is `async-nats` on a current-thread tokio runtime owned by the
//! publisher: [`Publisher::publish`] blocks the relay's thread while a batch
//! is in flight, as the trait expects.

use std::collections::HashMap;
use std::fmt;
use std::future::IntoFuture;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::context::{Context, PublishError, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::stream::{
    Config, LastRawMessageErrorKind, RetentionPolicy, StorageType, Stream,
};
use async_nats::jetstream::{self, ErrorCode};
use async_nats::{ConnectOptions, Event, ServerAddr};
use bytes::Bytes;
use futures_util::StreamExt;
use parking_lot::Mutex;

use crate::io::reader::Record;
use crate::outbox::Outbox;
use crate::relay::{Outcome, Publisher};

/// The header that carries a record's seq, in decimal.
pub const SEQ_HEADER: &str = "Segwal-Seq";

/// The header that carries the CRC-32 of a record's payload, in hex:
/// reconciliation answers [`Outcome::Duplicate`] only for a message whose seq
/// *and* payload match the record's.
pub const CRC_HEADER: &str = "Segwal-Crc32";

/// What a subject template's `{key}` becomes for a record without a key.
pub const NO_KEY_TOKEN: &str = "_";

/// How reconciliation reads the stream: at most this many message requests
/// at once,
const RECONCILE_MESSAGES_AT_ONCE: u64 = 256;

/// and, by the mean size of the messages of the round before, about this many
/// bytes at once, so that a tail of large messages neither takes the memory
/// of hundreds of them nor outlasts the timeout of each request.
const RECONCILE_BYTES_AT_ONCE: u64 = 4 << 20;

/// The first round, sized by the whole stream's mean message size, asks for
/// at most this many.
const RECONCILE_FIRST_ROUND_MAX: u64 = 32;

/// How a [`JetStream`] publisher connects and publishes. Built with
/// [`JetStreamOptions::new`].
#[derive(Clone, Debug)]
pub struct JetStreamOptions {
    servers: String,
    stream: String,
    subject: String,
    timeout: Duration,
    in_flight: usize,
    reconcile_depth: u64,
    create: Option<StreamSpec>,
}

/// The stream [`JetStreamOptions::create_stream`] creates when it is missing.
#[derive(Clone, Debug)]
struct StreamSpec {
    replicas: usize,
    max_message_size: Option<i32>,
    duplicate_window: Duration,
}

impl JetStreamOptions {
    /// Publish into the stream named `stream` on the servers `servers` (one
    /// URL, or several separated by commas: the members of a cluster, tried
    /// in turn and on reconnection), on subjects made from `subject`: a
    /// fixed subject, or a template in which `{key}` stands for the record's
    /// ordering key. A key made only of ASCII letters, digits, `-` and `_`
    /// is used as it is; any other key as `x` followed by its bytes in hex;
    /// a record without a key as `_` ([`NO_KEY_TOKEN`]).
    ///
    /// Defaults: a `PubAck` timeout of 5 s, 1024 acknowledgements in flight,
    /// a reconciliation depth of 10,000 messages, and a stream that must
    /// exist already (see [`create_stream`](JetStreamOptions::create_stream)).
    pub fn new(servers: &str, stream: &str, subject: &str) -> JetStreamOptions {
        JetStreamOptions {
            servers: servers.to_owned(),
            stream: stream.to_owned(),
            subject: subject.to_owned(),
            timeout: Duration::from_secs(5),
            in_flight: 1024,
            reconcile_depth: 10_000,
            create: None,
        }
    }

    /// How long a publish waits for its `PubAck` before it counts as
    /// [`Outcome::Retry`]. Default 5 s.
    pub fn timeout(mut self, timeout: Duration) -> JetStreamOptions {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Publishes whose `PubAck` may be outstanding at once. Default 1024; at
    /// least 1. A batch larger than this is published in chunks of it, each
    /// awaited before the next is sent.
    pub fn in_flight(mut self, publishes: usize) -> JetStreamOptions {
        self.in_flight = publishes.max(1);
        self
    }

    /// How many of the stream's last messages are read before the first
    /// publish, to find records of this outbox already stored (docs/RELAY.md,
    /// "records in doubt"). Default 10,000; 0 turns the check off, leaving
    /// deduplication to the stream's duplicate window alone.
    pub fn reconcile_depth(mut self, messages: u64) -> JetStreamOptions {
        self.reconcile_depth = messages;
        self
    }

    /// Creates the stream when it does not exist: file storage, `replicas`
    /// copies (1, or 3 on a cluster), capturing the subject template with
    /// `{key}` as `*`, a duplicate window of 2 minutes. An existing stream is
    /// used as it is. Found (or created) at the first publish, and again
    /// after the stream was deleted while the relay runs.
    pub fn create_stream(mut self, replicas: usize) -> JetStreamOptions {
        self.create = Some(StreamSpec {
            replicas: replicas.max(1),
            max_message_size: None,
            duplicate_window: Duration::from_secs(120),
        });
        self
    }

    /// With [`create_stream`](JetStreamOptions::create_stream): the largest
    /// message the stream accepts (the server refuses larger ones for good,
    /// and they become dead letters with its reason).
    pub fn stream_max_message_size(mut self, bytes: i32) -> JetStreamOptions {
        if let Some(spec) = &mut self.create {
            spec.max_message_size = Some(bytes);
        }
        self
    }

    /// With [`create_stream`](JetStreamOptions::create_stream): the stream's
    /// duplicate window (JetStream's deduplication of `Nats-Msg-Id`). Keep
    /// it longer than the relay's longest backoff plus the publish
    /// [`timeout`](JetStreamOptions::timeout): a record whose `PubAck` was
    /// lost is published again that much later (docs/RELAY.md).
    pub fn stream_duplicate_window(mut self, window: Duration) -> JetStreamOptions {
        if let Some(spec) = &mut self.create {
            spec.duplicate_window = window;
        }
        self
    }
}

/// A failure to connect to the servers or to find (or create) the stream.
#[derive(Debug)]
pub struct NatsError {
    /// What was being done: `"connect"`, `"stream"`, `"read"`, `"runtime"`.
    pub step: &'static str,
    /// The client's or the server's words.
    pub reason: String,
}

impl fmt::Display for NatsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NATS JetStream publisher, {}: {}",
            self.step, self.reason
        )
    }
}

impl std::error::Error for NatsError {}

fn nats_error(step: &'static str, reason: impl fmt::Display) -> NatsError {
    NatsError {
        step,
        reason: reason.to_string(),
    }
}

/// A [`Publisher`] into a NATS JetStream stream; see the module's
/// documentation and docs/RELAY.md.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use segwal::nats::{JetStream, JetStreamOptions};
/// use segwal::{Options, Outbox, Relay, RelayOptions};
///
/// let outbox = Outbox::open("./outbox", Options::default())?;
/// let options = JetStreamOptions::new("nats://127.0.0.1:4222", "EVENTS", "events.{key}")
///     .create_stream(1);
/// let publisher = JetStream::connect(&outbox, options)?;
/// let mut relay = Relay::new(outbox.clone(), publisher, RelayOptions::default());
/// let stop = std::sync::atomic::AtomicBool::new(false);
/// relay.run(&stop)?;
/// # Ok(())
/// # }
/// ```
pub struct JetStream {
    /// The client's runtime, driven by its own thread (`segwal-nats`), so
    /// the connection keeps answering the server between batches.
    runtime: tokio::runtime::Handle,
    driver: Option<(
        tokio::sync::oneshot::Sender<()>,
        std::thread::JoinHandle<()>,
    )>,
    context: Context,
    options: JetStreamOptions,
    /// `<outbox id in hex>-`: the start of every message id of this outbox.
    id_prefix: String,
    /// The subject template split at `{key}`, or whole when it has none.
    subject: (String, Option<String>),
    /// Seqs of this outbox found in the stream by reconciliation and not
    /// handed to this publisher since.
    stored_before: HashMap<u64, u32>,
    reconciled: Option<Reconciled>,
    /// How far a reconciliation that failed had read: the next goes on.
    progress: Option<Progress>,
    /// The stream, found by reconciliation, and what its configuration
    /// said when last read.
    stream: Option<(Stream, Keeping)>,
    /// The client's last failure to connect (or loss of its connection), and
    /// when; cleared when it connects. Said with every retry while it is not
    /// connected, so that a refused login tells itself from a server down.
    connection: Arc<Mutex<Option<(Instant, String)>>>,
}

/// How far reconciliation read the stream's tail (`next` to `last`, so many
/// messages a round), kept when an attempt fails so that the next goes on.
#[derive(Clone, Copy, Debug)]
struct Progress {
    next: u64,
    last: u64,
    at_once: u64,
    report: Reconciled,
}

/// What a stream's configuration says about keeping what it acknowledges.
#[derive(Clone, Copy, Debug)]
struct Keeping {
    /// When the configuration was read: again at most once a second.
    read_at: Instant,
    /// `no_ack`: no publish is answered.
    no_ack: bool,
    /// `interest` retention: a message no consumer is interested in is
    /// acknowledged and dropped.
    interest: bool,
}

impl Keeping {
    fn of(config: &Config) -> Keeping {
        Keeping {
            read_at: Instant::now(),
            no_ack: config.no_ack,
            interest: config.retention == RetentionPolicy::Interest,
        }
    }
}

/// Whether a batch may be published: to every subject, to none (and why),
/// or only to the subjects these consumer filters match (an `interest`
/// stream whose every consumer filters).
enum Gate {
    Open,
    Closed(String),
    Filters(Vec<String>),
}

/// Whether the NATS subject `subject` matches the filter `filter` (`*`
/// one token, `>` one or more at the end).
fn subject_matches(filter: &str, subject: &str) -> bool {
    let (mut filter, mut subject) = (filter.split('.'), subject.split('.'));
    loop {
        match (filter.next(), subject.next()) {
            (Some(">"), Some(_)) => return true,
            (Some(f), Some(s)) if f == "*" || f == s => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// A stream's extent ([`JetStream::stream_state`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamState {
    /// The lowest stream sequence still held.
    pub first: u64,
    /// The last stream sequence assigned.
    pub last: u64,
    /// Messages held.
    pub messages: u64,
}

/// One message read back from a stream ([`JetStream::read_stream`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredMessage {
    /// Its sequence in the stream.
    pub stream_seq: u64,
    /// Its subject.
    pub subject: String,
    /// Its `Nats-Msg-Id` header.
    pub message_id: Option<String>,
    /// Its `Segwal-Seq` header: the record's seq in its outbox.
    pub seq: Option<u64>,
    /// Its payload.
    pub payload: Vec<u8>,
}

/// What reconciliation found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Messages of the stream read.
    pub examined: u64,
    /// Of them, messages of this outbox.
    pub found: u64,
}

impl JetStream {
    /// Connects to the servers (retrying in the background when none is up
    /// yet). The stream is found (or created) and reconciled before the first
    /// publish, not here: a server that cannot be reached now is not an
    /// error; publishes wait for the connection and fail as
    /// [`Outcome::Retry`] when their timeout passes, naming the last failure
    /// to connect.
    ///
    /// Blocking, as its publishes are: call it, and run the relay, on a
    /// thread of its own or under `tokio::task::spawn_blocking`, never inside
    /// an async task or a `block_on` of another runtime (tokio refuses a
    /// runtime driven from inside another with a panic).
    pub fn connect(outbox: &Outbox, options: JetStreamOptions) -> Result<JetStream, NatsError> {
        JetStream::connect_as(outbox.id(), options)
    }

    /// [`connect`](JetStream::connect) for the outbox whose
    /// [`Outbox::id`] is `outbox_id`, without the outbox at hand: to read a
    /// stream back ([`read_stream`](JetStream::read_stream)) from another
    /// process than the outbox's owner.
    pub fn connect_as(outbox_id: u128, options: JetStreamOptions) -> Result<JetStream, NatsError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| nats_error("runtime", e))?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let driver = std::thread::Builder::new()
            .name("segwal-nats".into())
            .spawn(move || {
                let _ = runtime.block_on(stopped);
            })
            .map_err(|e| nats_error("runtime", e))?;
        let runtime = handle;
        let _entered = runtime.enter();
        let servers = options
            .servers
            .split(',')
            .map(|url| url.trim().parse::<ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| nats_error("connect", format!("{}: {e}", options.servers)))?;
        let connection = Arc::new(Mutex::new(None));
        let context = runtime.block_on(new_context(&servers, &options, &connection))?;
        let subject = match options.subject.split_once("{key}") {
            Some((before, after)) => (before.to_owned(), Some(after.to_owned())),
            None => (options.subject.clone(), None),
        };
        Ok(JetStream {
            runtime,
            driver: Some((stop, driver)),
            context,
            id_prefix: format!("{outbox_id:032x}-"),
            subject,
            options,
            stored_before: HashMap::new(),
            reconciled: None,
            progress: None,
            stream: None,
            connection,
        })
    }

    /// What reconciliation found, once it ran (before the first publish).
    pub fn reconciled(&self) -> Option<Reconciled> {
        self.reconciled
    }

    /// The message id of the record `seq` of this outbox.
    pub fn message_id(&self, seq: u64) -> String {
        format!("{}{seq}", self.id_prefix)
    }

    /// The stream's first and last sequence and its message count (finding
    /// or creating the stream as [`connect`](JetStream::connect)'s options
    /// say).
    pub fn stream_state(&mut self) -> Result<StreamState, NatsError> {
        self.runtime.block_on(async {
            let stream = find_stream(&self.context, &self.options)
                .await
                .map_err(|e| nats_error("stream", e))?;
            let info = stream
                .get_info()
                .await
                .map_err(|e| nats_error("stream", e))?;
            Ok(StreamState {
                first: info.state.first_sequence,
                last: info.state.last_sequence,
                messages: info.state.messages,
            })
        })
    }

    /// Reads the stream's messages with a stream sequence from `first` on,
    /// at most `max`, oldest first (messages deleted from the stream are
    /// skipped): for audits and tests, e.g. to check that a stream holds
    /// every record of an outbox exactly once.
    pub fn read_stream(&mut self, first: u64, max: usize) -> Result<Vec<StoredMessage>, NatsError> {
        self.runtime.block_on(async {
            let stream = find_stream(&self.context, &self.options)
                .await
                .map_err(|e| nats_error("stream", e))?;
            let info = stream
                .get_info()
                .await
                .map_err(|e| nats_error("stream", e))?;
            let last = info.state.last_sequence;
            let mean = (info.state.bytes / info.state.messages.max(1)).max(1);
            let mut at_once = (RECONCILE_BYTES_AT_ONCE / mean).clamp(1, RECONCILE_FIRST_ROUND_MAX);
            let mut out = Vec::with_capacity(max.min(1 << 16));
            let mut next = first.max(info.state.first_sequence).max(1);
            while next <= last && out.len() < max {
                let read = out.len();
                let end = (next + at_once - 1).min(last);
                let gets = (next..=end).map(|seq| stream.get_raw_message(seq));
                for message in futures_util::future::join_all(gets).await {
                    match message {
                        Ok(m) if out.len() < max => out.push(StoredMessage {
                            stream_seq: m.sequence,
                            subject: m.subject.to_string(),
                            message_id: m.headers.get("Nats-Msg-Id").map(|v| v.as_str().to_owned()),
                            seq: m
                                .headers
                                .get(SEQ_HEADER)
                                .and_then(|v| v.as_str().parse().ok()),
                            payload: m.payload.to_vec(),
                        }),
                        Ok(_) => {}
                        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => {}
                        Err(e) => return Err(nats_error("read", e)),
                    }
                }
                next = end + 1;
                // The next round by the size of this one's messages.
                let round = &out[read..];
                if !round.is_empty() {
                    let bytes: usize = round.iter().map(|m| m.payload.len()).sum();
                    let mean = (bytes / round.len()).max(1) as u64;
                    at_once = (RECONCILE_BYTES_AT_ONCE / mean).clamp(1, RECONCILE_MESSAGES_AT_ONCE);
                }
            }
            Ok(out)
        })
    }

    /// The subject of `record`.
    fn subject_of(&self, record: &Record) -> String {
        let (before, after) = &self.subject;
        let Some(after) = after else {
            return before.clone();
        };
        let mut subject = before.clone();
        push_key_token(&mut subject, record.key());
        subject.push_str(after);
        subject
    }

    /// Finds (or creates) the stream and reads its last messages for records
    /// of this outbox, going on from `progress` where an attempt failed.
    async fn reconcile(
        context: &Context,
        options: &JetStreamOptions,
        id_prefix: &str,
        found: &mut HashMap<u64, u32>,
        progress: &mut Option<Progress>,
    ) -> Result<(Reconciled, Stream), String> {
        let stream = find_stream(context, options).await?;
        let mut p = match progress.take() {
            Some(p) => p,
            None => {
                let info = stream.get_info().await.map_err(|e| e.to_string())?;
                let state = info.state;
                if state.messages == 0 || options.reconcile_depth == 0 {
                    return Ok((Reconciled::default(), stream));
                }
                let last = state.last_sequence;
                let from = state
                    .first_sequence
                    .max(last.saturating_sub(options.reconcile_depth - 1))
                    .max(1);
                // The first round by the whole stream's mean size, and at
                // most a few dozen: its tail may be larger than the rest.
                let mean = (state.bytes / state.messages).max(1);
                Progress {
                    next: from,
                    last,
                    at_once: (RECONCILE_BYTES_AT_ONCE / mean).clamp(1, RECONCILE_FIRST_ROUND_MAX),
                    report: Reconciled::default(),
                }
            }
        };
        while p.next <= p.last {
            let end = (p.next + p.at_once - 1).min(p.last);
            let gets = (p.next..=end).map(|seq| stream.get_raw_message(seq));
            let mut round = Reconciled::default();
            let mut round_bytes = 0u64;
            let mut seen = Vec::new();
            for message in futures_util::future::join_all(gets).await {
                let message = match message {
                    Ok(message) => message,
                    // Deleted (or aged out) since the stream's state was read.
                    Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => continue,
                    Err(e) => {
                        let at = p.next;
                        *progress = Some(p);
                        return Err(format!(
                            "{e} (the next attempt goes on from stream sequence {at})"
                        ));
                    }
                };
                round.examined += 1;
                round_bytes += message.payload.len() as u64;
                // This outbox's: the seq from the message id, the same in
                // its own header, and the payload's checksum.
                let headers = &message.headers;
                let from_id = headers
                    .get("Nats-Msg-Id")
                    .and_then(|id| id.as_str().strip_prefix(id_prefix).map(decimal));
                let from_header = headers.get(SEQ_HEADER).map(|s| decimal(s.as_str()));
                let crc = headers
                    .get(CRC_HEADER)
                    .and_then(|c| u32::from_str_radix(c.as_str(), 16).ok());
                if let (Some(Some(seq)), Some(Some(same)), Some(crc)) = (from_id, from_header, crc)
                    && seq == same
                {
                    round.found += 1;
                    seen.push((seq, crc));
                }
            }
            // Counted once the whole round is read: a failed round is read
            // again whole.
            found.extend(seen);
            p.report.examined += round.examined;
            p.report.found += round.found;
            p.next = end + 1;
            // The next round by the size of this one's messages.
            if let Some(mean) = round_bytes.checked_div(round.examined) {
                p.at_once =
                    (RECONCILE_BYTES_AT_ONCE / mean.max(1)).clamp(1, RECONCILE_MESSAGES_AT_ONCE);
            }
        }
        Ok((p.report, stream))
    }

    /// Whether the stream keeps what it acknowledges now. Its configuration
    /// is read again at most once a second (an edit can turn `no_ack` on or
    /// the retention to `interest`); an `interest` stream's configuration
    /// and consumers are read before each batch (two requests), since a
    /// message that no consumer's filter matches is acknowledged with a
    /// sequence and dropped. A consumer deleted between that read and the
    /// batch is not seen.
    fn gate(&mut self) -> Gate {
        let Some((stream, keeping)) = &mut self.stream else {
            return Gate::Closed("the stream is not found yet".into());
        };
        let name = &self.options.stream;
        if keeping.interest || keeping.read_at.elapsed() >= Duration::from_secs(1) {
            match self.runtime.block_on(stream.get_info()) {
                Ok(info) => *keeping = Keeping::of(&info.config),
                Err(e) => {
                    let reason = format!("reading stream {name}'s configuration: {e}");
                    // Deleted while the relay runs: found (or created) and
                    // reconciled again before the next publish.
                    // What the old stream held is gone with it.
                    if jetstream_code(&e) == Some(ErrorCode::STREAM_NOT_FOUND) {
                        self.stream = None;
                        self.reconciled = None;
                        self.progress = None;
                        self.stored_before.clear();
                    }
                    return Gate::Closed(reason);
                }
            }
        }
        if keeping.no_ack {
            return Gate::Closed(format!("stream {name} answers no publish (no_ack)"));
        }
        if !keeping.interest {
            return Gate::Open;
        }
        let consumers = self.runtime.block_on(async {
            let mut filters = Vec::new();
            let mut consumers = 0;
            let mut list = stream.consumers();
            while let Some(info) = list.next().await {
                let config = info.map_err(|e| e.to_string())?.config;
                consumers += 1;
                if config.filter_subject.is_empty() && config.filter_subjects.is_empty() {
                    return Ok(None);
                }
                filters.push(config.filter_subject);
                filters.extend(config.filter_subjects);
            }
            Ok::<_, String>(Some((consumers, filters)))
        });
        match consumers {
            Ok(None) => Gate::Open,
            Ok(Some((0, _))) => Gate::Closed(format!(
                "stream {name} keeps a message only for its consumers (interest retention) \
                 and has none: it would acknowledge the record and drop it"
            )),
            Ok(Some((_, filters))) => Gate::Filters(filters),
            Err(e) => Gate::Closed(format!("listing stream {name}'s consumers: {e}")),
        }
    }
}

/// A client (connecting in the background) and its JetStream context.
async fn new_context(
    servers: &[ServerAddr],
    options: &JetStreamOptions,
    connection: &Arc<Mutex<Option<(Instant, String)>>>,
) -> Result<Context, NatsError> {
    let last = connection.clone();
    let client = ConnectOptions::new()
        .event_callback(move |event| {
            let last = last.clone();
            async move {
                match event {
                    Event::Connected => *last.lock() = None,
                    Event::Disconnected | Event::ClientError(_) | Event::ServerError(_) => {
                        *last.lock() = Some((Instant::now(), event.to_string()));
                    }
                    _ => {}
                }
            }
        })
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connection_timeout(options.timeout)
        .reconnect_delay_callback(|attempts| Duration::from_millis(50 * attempts.min(20) as u64))
        .connect(servers.to_vec())
        .await
        .map_err(|e| nats_error("connect", e))?;
    Ok(jetstream::ContextBuilder::new()
        .timeout(options.timeout)
        .max_ack_inflight(options.in_flight)
        .backpressure_on_inflight(true)
        .build(client))
}

/// Appends the subject token of a record's `key`: the key as it is where it
/// cannot be taken for another key's token (letters, digits, `-` and `_`,
/// not starting with the `x` of an encoded key, not the no-key token), else
/// `x` and its bytes in hex; [`NO_KEY_TOKEN`] for no key. One key, one token.
fn push_key_token(subject: &mut String, key: Option<&[u8]>) {
    match key {
        None => subject.push_str(NO_KEY_TOKEN),
        Some(key)
            if !key.is_empty()
                && key[0] != b'x'
                && key != NO_KEY_TOKEN.as_bytes()
                && key
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_') =>
        {
            // Checked just above: ASCII only.
            subject.push_str(std::str::from_utf8(key).unwrap_or(NO_KEY_TOKEN));
        }
        Some(key) => {
            subject.push('x');
            for b in key {
                subject.push_str(&format!("{b:02x}"));
            }
        }
    }
}

/// The JetStream error code behind `error`, if any.
fn jetstream_code(error: &(dyn std::error::Error + 'static)) -> Option<ErrorCode> {
    let mut at = Some(error);
    while let Some(e) = at {
        if let Some(js) = e.downcast_ref::<jetstream::Error>() {
            return Some(js.error_code());
        }
        at = e.source();
    }
    None
}

/// A seq written by this publisher: ASCII digits only.
fn decimal(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The stream, created from the options' spec when it is missing.
async fn find_stream(context: &Context, options: &JetStreamOptions) -> Result<Stream, String> {
    match &options.create {
        None => context
            .get_stream(&options.stream)
            .await
            .map_err(|e| format!("stream {}: {e}", options.stream)),
        Some(spec) => {
            let mut config = Config {
                name: options.stream.clone(),
                subjects: vec![options.subject.replace("{key}", "*")],
                storage: StorageType::File,
                num_replicas: spec.replicas,
                duplicate_window: spec.duplicate_window,
                ..Default::default()
            };
            if let Some(bytes) = spec.max_message_size {
                config.max_message_size = bytes;
            }
            context
                .get_or_create_stream(config)
                .await
                .map_err(|e| format!("stream {}: {e}", options.stream))
        }
    }
}

impl Drop for JetStream {
    fn drop(&mut self) {
        if let Some((stop, driver)) = self.driver.take() {
            let _ = stop.send(());
            let _ = driver.join();
        }
    }
}

impl Publisher for JetStream {
    fn publish(&mut self, records: &[Record]) -> Vec<Outcome> {
        let mut outcomes = self.publish_batch(records);
        // Not connected: every retry says why the client is not, so that a
        // refused login or certificate tells itself from a server down.
        let connected =
            self.context.client().connection_state() == async_nats::connection::State::Connected;
        if !connected {
            let note = match &*self.connection.lock() {
                Some((at, why)) => format!(
                    "not connected to any server; {} s ago: {why}",
                    at.elapsed().as_secs()
                ),
                None => "not connected to any server".to_owned(),
            };
            for outcome in &mut outcomes {
                if let Outcome::Retry(reason) = outcome {
                    *reason = format!("{reason} ({note})");
                }
            }
        }
        outcomes
    }
}

impl JetStream {
    /// [`Publisher::publish`], but for what the connection's state adds.
    fn publish_batch(&mut self, records: &[Record]) -> Vec<Outcome> {
        if self.reconciled.is_none() {
            let reconciled = self.runtime.block_on(JetStream::reconcile(
                &self.context,
                &self.options,
                &self.id_prefix,
                &mut self.stored_before,
                &mut self.progress,
            ));
            match reconciled {
                Ok((report, stream)) => {
                    self.reconciled = Some(report);
                    let keeping = Keeping::of(&stream.cached_info().config);
                    self.stream = Some((stream, keeping));
                }
                Err(reason) => {
                    let reason = format!("reading the stream's last messages: {reason}");
                    return vec![Outcome::Retry(reason); records.len()];
                }
            }
        }
        let mut gate = None;
        let mut outcomes: Vec<Option<Outcome>> = vec![None; records.len()];
        let mut messages = Vec::with_capacity(records.len());
        for (i, record) in records.iter().enumerate() {
            let seq = record.seq().get();
            let crc = crc32fast::hash(record.payload());
            // Kept after the answer: the record may come back (its ack
            // failed, its lease ran out) and must get the same answer.
            if self.stored_before.get(&seq) == Some(&crc) {
                outcomes[i] = Some(Outcome::Duplicate);
                continue;
            }
            // Asked once a batch, and only when something is to be sent.
            let subject = self.subject_of(record);
            match gate.get_or_insert_with(|| self.gate()) {
                Gate::Open => {}
                Gate::Closed(reason) => {
                    outcomes[i] = Some(Outcome::Retry(reason.clone()));
                    continue;
                }
                Gate::Filters(filters) => {
                    if !filters.iter().any(|f| subject_matches(f, &subject)) {
                        outcomes[i] = Some(Outcome::Retry(format!(
                            "no consumer of stream {} is interested in {subject} \
                             (interest retention): it would acknowledge the record \
                             and drop it",
                            self.options.stream
                        )));
                        continue;
                    }
                }
            }
            let message = PublishMessage::build()
                .payload(Bytes::copy_from_slice(record.payload()))
                .message_id(self.message_id(seq))
                // A subject another stream captures is refused by the
                // server (JetStream error 10060), never stored there.
                .expected_stream(&self.options.stream)
                .header(SEQ_HEADER, seq.to_string().as_str())
                .header(CRC_HEADER, format!("{crc:08x}").as_str());
            messages.push((i, subject, message));
        }
        let context = &self.context;
        let connected =
            context.client().connection_state() == async_nats::connection::State::Connected;
        let mut timed_out = false;
        let in_flight = self.options.in_flight;
        let mut messages = messages.into_iter().peekable();
        self.runtime.block_on(async {
            // Up to `in_flight` at a time (each unanswered publish holds one of
            // the client's permits): all of a chunk sent first, pipelined,
            // then its PubAcks awaited.
            while messages.peek().is_some() {
                let mut acks = Vec::with_capacity(in_flight);
                for (i, subject, message) in messages.by_ref().take(in_flight) {
                    if timed_out {
                        // The connection takes no more: the rest waits for the
                        // next round rather than a timeout each.
                        outcomes[i] =
                            Some(Outcome::Retry("the connection accepts no publish".into()));
                        continue;
                    }
                    match context.send_publish(subject, message).await {
                        Ok(ack) => acks.push((i, ack)),
                        Err(e) => {
                            timed_out |= e.kind() == PublishErrorKind::TimedOut;
                            outcomes[i] = Some(outcome_of_error(&e, connected));
                        }
                    }
                }
                // Awaited together: each PubAck's timeout runs from when it is
                // first polled, so awaiting them one after another would let a
                // batch the broker does not answer (a stream without a leader)
                // take its length times the timeout.
                let (indexes, acks): (Vec<usize>, Vec<_>) = acks.into_iter().unzip();
                let answers =
                    futures_util::future::join_all(acks.into_iter().map(IntoFuture::into_future))
                        .await;
                for (i, answer) in indexes.into_iter().zip(answers) {
                    outcomes[i] = Some(match answer {
                        Ok(ack) => outcome_of_ack(&ack, &self.options.stream),
                        Err(e) => outcome_of_error(&e, connected),
                    });
                }
            }
        });
        outcomes
            .into_iter()
            .map(|o| o.unwrap_or_else(|| Outcome::Retry("not published".into())))
            .collect()
    }
}

/// A `PubAck`: stored in `stream`, or a duplicate of a message `stream`
/// holds at `ack.sequence`. A duplicate at sequence 0 is not one: a
/// clustered stream's leader of nats-server 2.10 answers so for a message id
/// whose first publish it has proposed but not yet stored (it stages the id
/// with sequence 0 before the proposal commits). That proposal can still be
/// lost (its leader steps down), and then nothing holds the record: it is
/// retried, and its next publish is answered with the sequence it was stored
/// at, or is stored, once the staged id is gone. Servers from 2.11 answer
/// such a publish with JetStream error 10158, "duplicate message id is in
/// process", instead (nats-io/nats-server commit 53de79a), a `Retry` too.
/// A `PubAck` without a sequence, or from another stream (a server that
/// ignored the expected stream), proves nothing either.
fn outcome_of_ack(ack: &PublishAck, stream: &str) -> Outcome {
    if ack.stream != stream {
        return Outcome::Retry(format!(
            "a PubAck from stream {:?}, not {stream:?}",
            ack.stream
        ));
    }
    match (ack.duplicate, ack.sequence) {
        (true, 0) => Outcome::Retry(
            "the stream is still storing an earlier publish of this record \
             (a duplicate without a sequence)"
                .into(),
        ),
        (false, 0) => Outcome::Retry("a PubAck without a sequence".into()),
        (true, _) => Outcome::Duplicate,
        (false, _) => Outcome::Stored,
    }
}

/// A failed publish: refused for good when the message is too large for the
/// stream, or for the connection's `max_payload` once the server said it
/// (`connected`; before that the client assumes 1 MiB); otherwise (a
/// timeout, no stream leader yet, a broken connection) retried.
fn outcome_of_error(error: &PublishError, connected: bool) -> Outcome {
    let refused = match error.kind() {
        PublishErrorKind::MaxPayloadExceeded => connected,
        PublishErrorKind::Other => std::error::Error::source(error)
            .and_then(|source| source.downcast_ref::<jetstream::Error>())
            .is_some_and(|e| e.error_code() == ErrorCode::STREAM_MESSAGE_EXCEEDS_MAXIMUM),
        _ => false,
    };
    // The source, where the error's own text does not say it already.
    let reason = error.to_string();
    let reason = match std::error::Error::source(error).map(ToString::to_string) {
        Some(source) if !reason.contains(&source) => format!("{reason}: {source}"),
        _ => reason,
    };
    if refused {
        Outcome::Refused(reason)
    } else {
        Outcome::Retry(reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `PubAck` as the server writes it.
    fn ack(json: &str) -> PublishAck {
        serde_json::from_str(json).expect("a PubAck")
    }

    /// Regression: `.` was encoded as `x2e`, which the key `x2e` also gave,
    /// and the key `_` gave the no-key token.
    #[test]
    fn each_key_has_a_subject_token_of_its_own() {
        let token = |key: Option<&[u8]>| {
            let mut t = String::new();
            push_key_token(&mut t, key);
            t
        };
        assert_eq!(token(None), "_");
        assert_eq!(token(Some(b"order-42")), "order-42");
        assert_eq!(token(Some(b"a_b")), "a_b");
        assert_eq!(token(Some(b".")), "x2e");
        assert_eq!(token(Some(b"x2e")), "x783265");
        assert_eq!(token(Some(b"_")), "x5f");
        let keys: [Option<&[u8]>; 14] = [
            None,
            Some(b""),
            Some(b"_"),
            Some(b"x"),
            Some(b"X"),
            Some(b"."),
            Some(b"x2e"),
            Some(b"x5f"),
            Some(b"x78"),
            Some(b"-"),
            Some(b"a.b"),
            Some(b"a b"),
            Some(b"xa"),
            Some("é".as_bytes()),
        ];
        let mut tokens: Vec<String> = keys.iter().map(|k| token(*k)).collect();
        for t in &tokens {
            assert!(
                !t.is_empty()
                    && t.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'),
                "{t:?} is not one subject token"
            );
        }
        tokens.sort();
        tokens.dedup();
        assert_eq!(tokens.len(), keys.len(), "two keys share a token");
    }

    #[test]
    fn subjects_match_filters_token_by_token() {
        for (filter, subject, matches) in [
            ("a.b", "a.b", true),
            ("a.*", "a.b", true),
            ("a.*", "a.b.c", false),
            ("a.>", "a.b.c", true),
            ("a.>", "a", false),
            (">", "a", true),
            ("a.b", "a.c", false),
            ("a.b", "a", false),
            ("*.b", "a.b", true),
        ] {
            assert_eq!(
                subject_matches(filter, subject),
                matches,
                "{filter} {subject}"
            );
        }
    }

    #[test]
    fn only_an_answer_with_a_sequence_from_the_stream_settles_a_record() {
        let outcome = |json| outcome_of_ack(&ack(json), "S");
        assert_eq!(outcome(r#"{"stream":"S","seq":7}"#), Outcome::Stored);
        assert_eq!(
            outcome(r#"{"stream":"S","seq":7,"duplicate":true}"#),
            Outcome::Duplicate
        );
        // A 2.10 leader's answer to a message id it has proposed, not stored.
        assert!(matches!(
            outcome(r#"{"stream":"S","seq":0,"duplicate": true}"#),
            Outcome::Retry(r) if r.contains("still storing")
        ));
        assert!(matches!(
            outcome(r#"{"stream":"S","seq":0}"#),
            Outcome::Retry(_)
        ));
        assert!(matches!(
            outcome(r#"{"stream":"OTHER","seq":7}"#),
            Outcome::Retry(r) if r.contains("OTHER")
        ));
    }
}
