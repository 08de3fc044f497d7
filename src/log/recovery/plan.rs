//! Deciding: from what the scans read, what recovery keeps, cuts, removes and
//! creates, or why it must refuse to open. A pure function of the scans: no
//! file is touched here, so every crash case of docs/FORMAT.md ("Crash cases,
//! one by one") is tested below on bytes built in memory.

use std::path::PathBuf;

use super::report::{Dropped, TornTail};
use super::scan::{Damage, SealAt, SegmentScan};
use crate::error::{Corruption, Error, Result};
use crate::format::segment::{FORMAT_VERSION, FRAMES_AT, align_up};
use crate::format::seq::{SEQ_MAX, Seq};
use crate::options::RecoveryMode;

/// What recovery will change on disk, decided before anything is changed.
/// Segments are named by their index in the scans.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Newest files that provably hold nothing (every byte zero, or this
    /// outbox's header and no frame): removed first of all.
    pub remove_empty: Vec<usize>,
    /// Files wholly below the log start, left by an interrupted deletion.
    pub leftovers: Vec<usize>,
    /// Segments a lossy repair drops whole.
    pub remove: Vec<usize>,
    /// The segments kept, oldest first; all sealed from now on.
    pub keep: Vec<Keep>,
    /// The writer's active segment.
    pub active: ActivePlan,
    /// The seal the newest kept segment lacks: the writer writes it first.
    pub seal: Option<SealPlan>,
    /// First sequence number of the oldest segment of the log.
    pub log_start: Seq,
    pub torn: Option<TornTail>,
    pub dropped: Option<Dropped>,
    /// Records the kept segments hold.
    pub records: u64,
    /// The outbox's identity, as its segments name it (`None` for a directory
    /// without a segment header: a new outbox).
    pub outbox_id: Option<u128>,
}

/// A segment recovery keeps.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Keep {
    pub scan: usize,
    /// How many of its frames are kept.
    pub frames: usize,
    /// Where the file is cut, if it is.
    pub cut: Option<u64>,
}

/// Where the writer starts.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ActivePlan {
    /// An empty newest segment (created by a rotation or a recovery that a crash
    /// interrupted) becomes the active segment again.
    Reuse { scan: usize },
    /// A new segment, named above every number seen, its predecessor `prev`.
    Create { first: Seq, prev: Seq },
}

/// A seal for the newest kept segment (the last of `keep`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SealPlan {
    /// Where it goes: just after the last frame kept.
    pub at: u64,
    /// Its sequence number: the predecessor the active segment names.
    pub seq: Seq,
}

/// One segment as the plan sees it while deciding: the scan, and how much of it
/// is kept so far.
#[derive(Clone)]
struct View<'a> {
    at: usize,
    scan: &'a SegmentScan,
    /// Frames kept.
    kept: usize,
    seal: Option<SealAt>,
    cut: Option<u64>,
    damage: Option<Damage>,
}

impl<'a> View<'a> {
    fn new(at: usize, scan: &'a SegmentScan) -> View<'a> {
        View {
            at,
            scan,
            kept: scan.frames.len(),
            seal: scan.seal,
            cut: None,
            damage: scan.damage.clone(),
        }
    }

    /// Sequence number of the `n`-th frame counting from 1 (`None` for 0).
    /// Numbers are contiguous within a segment except that its seal frame, always
    /// the last, may skip ahead.
    fn seq_at(&self, n: usize) -> Option<Seq> {
        match self.seal {
            Some(seal) if n == self.kept && n > 0 => Some(seal.seq),
            _ => (n > 0).then(|| Seq::from(self.scan.id.0 + n as u64 - 1)),
        }
    }

    /// Last sequence number held (before any damage), or the one before the
    /// segment if it holds no frame.
    fn last_seq(&self) -> Seq {
        self.seq_at(self.kept).unwrap_or_else(|| {
            self.scan
                .header
                .map_or(Seq::from(self.scan.id.0.saturating_sub(1)), |h| h.prev_seq)
        })
    }

    /// Byte offset just past the last frame kept.
    fn end(&self) -> u64 {
        self.scan
            .frames
            .end_of_first(self.kept)
            .unwrap_or(FRAMES_AT as u64)
    }

    /// A whole header and nothing after it.
    fn is_empty_and_whole(&self) -> bool {
        self.scan.header.is_some() && self.kept == 0 && self.damage.is_none()
    }

    /// The predecessor its header names (0 without a header).
    fn prev_seq(&self) -> Seq {
        self.scan.header.map_or(Seq::from(0), |h| h.prev_seq)
    }

    /// Plans a cut at `cut` and forgets the frames past it.
    fn cut_at(&mut self, cut: u64) {
        self.kept = frames_below(self.scan, cut);
        if self.seal.is_some_and(|s| u64::from(s.offset) >= cut) {
            self.seal = None;
        }
        self.cut = Some(cut);
    }

    fn corrupt(&self, d: &Damage) -> Error {
        Error::Corrupt {
            path: self.scan.path.clone(),
            offset: d.offset,
            seq: Some(d.expected),
            kind: d.cause.clone(),
        }
    }
}

/// How many frames of `scan` end at or before `cut`.
fn frames_below(scan: &SegmentScan, cut: u64) -> usize {
    scan.frames.count_ending_by(cut)
}

/// The log's state while the plan is decided.
struct Deciding<'a> {
    /// The segments holding frames, oldest first.
    live: Vec<View<'a>>,
    /// An empty newest segment, to be the active one.
    reuse: Option<View<'a>>,
    remove_empty: Vec<usize>,
    remove: Vec<usize>,
    torn: Option<TornTail>,
    dropped: Option<Dropped>,
}

/// Decides what recovery does with the segments `scans` (in log order: sorted
/// by name) under `mode`, or why the outbox must not open.
pub(crate) fn plan(scans: &[SegmentScan], mode: RecoveryMode) -> Result<Plan> {
    let outbox_id = check_versions_and_owner(scans)?;
    let log_start = recorded_log_start(scans);
    let leftovers = scans
        .iter()
        .take_while(|s| s.id.first_seq() < log_start)
        .count();
    // Files below the log start are acknowledged, whatever they now hold, but
    // they must be segwal's own files.
    if let Some(foreign) = scans[..leftovers].iter().find(|s| s.header.is_none()) {
        let cause = foreign
            .damage
            .as_ref()
            .map_or(Corruption::BadSegmentHeader, |d| d.cause.clone());
        return Err(Error::Corrupt {
            path: foreign.path.clone(),
            offset: 0,
            seq: None,
            kind: cause,
        });
    }
    let mut d = Deciding {
        live: scans
            .iter()
            .enumerate()
            .skip(leftovers)
            .map(|(k, s)| View::new(k, s))
            .collect(),
        reuse: None,
        remove_empty: Vec::new(),
        remove: Vec::new(),
        torn: None,
        dropped: None,
    };
    let max_seen = max_seen(scans, &d.live);
    settle_newest(&mut d);
    // A file that is not a segment at all (its header does not check, and its
    // bytes do not prove it holds nothing) is named first: the gap or missing
    // seal it makes is a consequence.
    if mode != RecoveryMode::Lossy
        && let Some(v) = d.live.iter().find(|v| v.scan.header.is_none())
        && let Some(damage) = &v.damage
    {
        return Err(v.corrupt(damage));
    }
    check_log_start(&d, scans.get(..leftovers).and_then(<[_]>::last), log_start)?;
    if let Some((k, damage)) = first_damage(&mut d) {
        let damaged =
            d.live.get(k).or(d.reuse.as_ref()).unwrap_or_else(|| {
                unreachable!("damage found in a segment that is not in the log")
            });
        // A frame whose checksum holds and whose content this build does
        // not know was written by a newer build (or another format): not
        // damage, and not a lossy repair's to drop with every record after
        // it. The build that wrote it reads it.
        if mode != RecoveryMode::Lossy || damage.cause.is_unknown_format() {
            return Err(damaged.corrupt(&damage));
        }
        // Nor is it dropped with the segments after real damage: a lossy
        // repair would set them aside whole.
        if let Some((later, newer)) = d.live.iter().chain(d.reuse.as_ref()).find_map(|v| {
            Some((
                v,
                v.damage.as_ref().filter(|n| n.cause.is_unknown_format())?,
            ))
        }) {
            return Err(later.corrupt(newer));
        }
        drop_from(&mut d, k, damage, max_seen);
    }
    // Damage is named first: a number beyond the limit may be its symptom.
    check_seq_room(scans, max_seen)?;
    let mut plan = finish(d, scans, leftovers, log_start, max_seen);
    plan.outbox_id = outbox_id;
    Ok(plan)
}

/// Refuses a directory holding a segment of another format version (whole
/// headers only: a checksum that holds says the version is what was written),
/// or of another outbox; returns the outbox's identity.
fn check_versions_and_owner(scans: &[SegmentScan]) -> Result<Option<u128>> {
    for s in scans {
        if let Some(Damage {
            cause: Corruption::UnsupportedVersion { found },
            ..
        }) = &s.damage
        {
            return Err(Error::UnsupportedFormat {
                path: s.path.clone(),
                found: *found,
                supported: FORMAT_VERSION,
            });
        }
    }
    let id = scans
        .iter()
        .rev()
        .find_map(|s| s.header.map(|h| h.outbox_id));
    if let Some(expected) = id
        && let Some(foreign) = scans
            .iter()
            .find(|s| s.header.is_some_and(|h| h.outbox_id != expected))
    {
        return Err(Error::Corrupt {
            path: foreign.path.clone(),
            offset: 0,
            seq: None,
            kind: Corruption::ForeignOutbox {
                expected,
                found: foreign.header.map_or(0, |h| h.outbox_id),
            },
        });
    }
    Ok(id)
}

/// The highest sequence number an open accepts on disk, in a file name, a
/// header or a frame: half the format's bound ([`SEQ_MAX`]). At a billion
/// appends a second it lasts 73 years, so no log reaches it; and a process
/// that opens below it cannot append its way to `SEQ_MAX`, which no frame may
/// hold. A directory whose files name a number at or above it was not
/// written by segwal.
pub(crate) const SEQ_OPEN_LIMIT: u64 = SEQ_MAX / 2;

/// Refuses a log whose numbers reach [`SEQ_OPEN_LIMIT`], naming the file with
/// the highest name.
fn check_seq_room(scans: &[SegmentScan], max_seen: Seq) -> Result<()> {
    let Some(last) = scans.last() else {
        return Ok(());
    };
    let highest = max_seen.get().max(last.id.first_seq().get());
    if highest < SEQ_OPEN_LIMIT {
        return Ok(());
    }
    Err(Error::Corrupt {
        path: last.path.clone(),
        offset: 0,
        seq: None,
        kind: Corruption::Unsupported {
            what: "sequence number at or above 2^61 (not written by segwal)",
            value: highest,
        },
    })
}

/// The log start: the highest recorded anywhere, in a header or a `LogStart`
/// frame.
fn recorded_log_start(scans: &[SegmentScan]) -> Seq {
    scans
        .iter()
        .flat_map(|s| [s.header.map(|h| h.log_start), s.log_start_marker()])
        .flatten()
        .max()
        .unwrap_or(Seq::from(1))
}

/// The highest number the disk shows was ever assigned: in any frame, valid or
/// past damage, in any header, in any file name. Nothing at or below it is
/// assigned again.
fn max_seen(scans: &[SegmentScan], live: &[View<'_>]) -> Seq {
    let highest_id = scans.last().map_or(0, |s| s.id.0);
    live.iter()
        .flat_map(|s| {
            [
                s.seq_at(s.kept),
                s.damage.as_ref().and_then(|d| d.max_seen.max(d.could_hold)),
                s.scan.header.map(|h| h.prev_seq),
            ]
        })
        .flatten()
        .max()
        .unwrap_or(Seq::from(0))
        .max(Seq::from(highest_id.saturating_sub(1)))
}

/// The newest end of the log, newest file first:
/// - an empty newest segment (created by a rotation or a recovery, nothing
///   written to it yet) becomes the writer's active segment again;
/// - a newest file that provably holds nothing goes: every byte zero, or a
///   whole header with nothing after it that a frame could have been; any other
///   file whose header does not check is corruption (or not ours), since a
///   segment takes its name only once its header is durable;
/// - a torn tail of the newest segment holding frames is cut at the start of
///   its write batch.
///
/// A crash inside recovery can leave one of each, so this repeats.
fn settle_newest(d: &mut Deciding<'_>) {
    while !d.live.is_empty() {
        // Whether the segment before the newest lacks its seal: then the newest
        // never received a frame (a seal is fsynced before its successor's
        // first frame is written).
        let n = d.live.len();
        let before = n.checked_sub(2).and_then(|k| d.live.get(k));
        let after_unsealed = before.filter(|b| b.seal.is_none()).map(View::last_seq);
        let Some(last) = d.live.last_mut() else { break };
        if last.is_empty_and_whole() && d.reuse.is_none() {
            d.reuse = d.live.pop();
            continue;
        }
        let (kept, prev_seq, scan) = (last.kept, last.prev_seq(), last.scan);
        let Some(damage) = last.damage.as_mut() else {
            break;
        };
        if let Some(e) = damage.evidence {
            // Not torn: say why, here where a torn tail was possible; but a
            // frame whose checksum holds says what it is (a frame of a newer
            // build is unsupported, not damaged).
            if crate::format::frame::is_checksummed(&damage.cause) {
                break;
            }
            damage.cause = Corruption::DamageBeforeValidFrame {
                valid_offset: e.offset,
                valid_seq: e.seq,
            };
            break;
        }
        if !damage.tearable {
            break;
        }
        let cut = damage.batch_start;
        // The bytes of the cut batch that this segment's checksums name (not
        // the zeros preallocated after them, nor a recycled file's older
        // bytes); a file removed whole counts its header's block (what
        // `look_past` found), none if blank.
        let whole = if scan.blank { 0 } else { scan.len };
        let written_end = damage.written_end.map_or(whole, |end| end.min(scan.len));
        let torn = |offset: u64| TornTail {
            path: scan.path.clone(),
            offset,
            bytes: written_end.saturating_sub(offset),
            cause: damage.cause.clone(),
        };
        // The newest names a predecessor after the other's last frame, as a
        // rotation does, and no valid frame of its own lies past the damage.
        let holds_nothing = kept == 0
            && damage.max_seen.is_none()
            && after_unsealed.is_some_and(|prev_last| prev_seq > prev_last);
        if cut < FRAMES_AT as u64 && !scan.blank {
            // A file bearing a segment's name has a durable header (a segment
            // is renamed to it only then): one that does not check is not an
            // interrupted creation, and recovery does not remove a file it
            // cannot prove it wrote. Corruption, or a file that is not ours.
            damage.tearable = false;
            break;
        }
        if cut < FRAMES_AT as u64 || holds_nothing {
            // The file holds nothing: every byte is zero (a file system can
            // leave a file's name and size without its data). Likewise a whole
            // header, which proves the file is this outbox's, followed by
            // garbage (a preallocation or a grown size that reached the disk
            // before the space was written) when the segment before it was
            // never sealed: no frame was ever written after that header.
            d.torn = Some(torn(0));
            d.remove_empty.extend(d.live.pop().map(|v| v.at));
            continue;
        }
        d.torn = Some(torn(cut));
        last.damage = None;
        // Even if the cut leaves no frame, the segment is not reused: the writer
        // would hand out the numbers of the frames just cut. It is sealed, and
        // the writer goes on above every number seen.
        last.cut_at(cut);
        break;
    }
}

/// The oldest segment left must start at the log start; `last_leftover` is the
/// newest file below it, if any.
fn check_log_start(
    d: &Deciding<'_>,
    last_leftover: Option<&SegmentScan>,
    log_start: Seq,
) -> Result<()> {
    let missing = |path: &PathBuf| {
        Err(Error::Corrupt {
            path: path.clone(),
            offset: 0,
            seq: Some(log_start),
            kind: Corruption::MissingSegment {
                expected_first: log_start,
            },
        })
    };
    match (d.live.first().or(d.reuse.as_ref()), last_leftover) {
        (Some(oldest), _) if oldest.scan.id.first_seq() != log_start => missing(&oldest.scan.path),
        // Every file is below the recorded log start, yet the segment that
        // recorded it must still exist.
        (None, Some(last)) => missing(&last.path),
        _ => Ok(()),
    }
}

/// Every other damage, in log order: inside a segment, or between two. Returns
/// the index in `live` of the segment to report it on (`live.len()`: the reused
/// active segment).
fn first_damage(d: &mut Deciding<'_>) -> Option<(usize, Damage)> {
    for k in 0..d.live.len() {
        if let Some(damage) = d.live[k].damage.take() {
            return Some((k, damage));
        }
        // A next file that is not a segment at all (its header does not check)
        // is named, rather than the seal it makes look missing.
        if d.live.get(k + 1).is_some_and(|n| n.scan.header.is_none())
            && let Some(damage) = d.live[k + 1].damage.take()
        {
            return Some((k + 1, damage));
        }
        let next = match d.live.get(k + 1) {
            Some(n) => Link::Segment(n),
            None => d.reuse.as_ref().map_or(Link::Nothing, Link::Active),
        };
        if let Some(damage) = check_link(&d.live[k], next) {
            // A broken link is reported on the later file when there is one.
            let at = if damage.offset == 0 { k + 1 } else { k };
            return Some((at, damage));
        }
    }
    None
}

/// A lossy repair: cuts at the start of the damaged write batch of segment `k`,
/// so that what is kept still ends at the end of a batch, and drops every later
/// segment.
fn drop_from(d: &mut Deciding<'_>, k: usize, damage: Damage, max_seen: Seq) {
    let path = d
        .live
        .get(k)
        .or(d.reuse.as_ref())
        .map(|v| v.scan.path.clone())
        .unwrap_or_default();
    let later: Vec<View<'_>> = d.live.drain((k + 1).min(d.live.len())..).collect();
    d.remove.extend(later.iter().chain(&d.reuse).map(|v| v.at));
    let mut deleted: Vec<PathBuf> = later
        .iter()
        .chain(&d.reuse)
        .map(|v| v.scan.path.clone())
        .collect();
    d.reuse = None;
    d.torn = None;
    let mut first = damage.expected;
    if let Some(s) = d.live.get_mut(k) {
        let kept = frames_below(s.scan, damage.batch_start);
        first = first.min(s.seq_at(kept + 1).unwrap_or(first));
        if kept == 0 {
            if let Some(v) = d.live.pop() {
                d.remove.push(v.at);
                deleted.push(v.scan.path.clone());
            }
        } else {
            s.cut_at(damage.batch_start);
        }
    }
    d.dropped = Some(Dropped {
        path,
        offset: damage.batch_start,
        cause: damage.cause,
        first,
        last: Some(max_seen).filter(|&m| m >= first),
        // Found once the dropped frames are read (`recover`).
        relocated: Vec::new(),
        acks_dropped: 0,
        changes_dropped: 0,
        segments_set_aside: deleted,
    });
}

/// The writer's active segment: the empty one found, or a new one named above
/// every number and file seen. The segment before it is sealed with the number
/// the active segment's header names, unless it already is.
fn finish(
    d: Deciding<'_>,
    scans: &[SegmentScan],
    leftovers: usize,
    log_start: Seq,
    max_seen: Seq,
) -> Plan {
    let highest_id = scans.last().map_or(0, |s| s.id.0);
    let newest_seal = d.live.last().and_then(|s| s.seal.map(|s| s.seq));
    let (active_prev, active) = match &d.reuse {
        Some(r) => (
            r.scan.header.map_or(max_seen, |h| h.prev_seq),
            ActivePlan::Reuse { scan: r.at },
        ),
        None => {
            let prev = match (d.live.last(), newest_seal) {
                (Some(_), Some(seal)) => seal,
                (Some(_), None) => max_seen.next(),
                (None, _) => max_seen,
            };
            let first = prev.max(max_seen).max(Seq::from(highest_id)).next();
            (prev, ActivePlan::Create { first, prev })
        }
    };
    let seal = d
        .live
        .last()
        .filter(|s| s.seal.is_none())
        .map(|s| SealPlan {
            // A seal starts a block: the frames before it are durable.
            at: align_up(s.end()),
            seq: active_prev,
        });
    let log_start = match (d.live.first(), &d.reuse, &active) {
        (Some(s), _, _) => s.scan.id.first_seq(),
        (None, Some(r), _) => r.scan.id.first_seq(),
        (None, None, ActivePlan::Create { first, .. }) => *first,
        (None, None, ActivePlan::Reuse { .. }) => log_start,
    };
    let records = d
        .live
        .iter()
        .map(|s| s.scan.frames.records_in_first(s.kept) as u64)
        .sum();
    Plan {
        remove_empty: d.remove_empty,
        leftovers: (0..leftovers).collect(),
        remove: d.remove,
        keep: d
            .live
            .iter()
            .map(|s| Keep {
                scan: s.at,
                frames: s.kept,
                cut: s.cut.or_else(|| past_seal(s)),
            })
            .collect(),
        active,
        seal,
        log_start,
        torn: d.torn,
        dropped: d.dropped,
        records,
        outbox_id: None,
    }
}

/// Where a sealed segment whose file goes on past its seal is cut: at the
/// seal's end. Nothing is written after a seal, so what lies there is
/// preallocated zeros, or a recycled file's old bytes, that the cut after the
/// seal never removed (a power cut before its `fdatasync`): cut now, so that
/// the file ends with its seal's trailer again and later opens read it
/// through its index (docs/FORMAT.md, "Recycled segments").
fn past_seal(s: &View<'_>) -> Option<u64> {
    s.seal?;
    let end = s.scan.frames.end_of_first(s.kept)?;
    (s.scan.len > end).then_some(end)
}

/// What follows a segment in the log.
enum Link<'v, 'a> {
    /// Another segment holding frames.
    Segment(&'v View<'a>),
    /// The empty segment that becomes the writer's active one.
    Active(&'v View<'a>),
    /// Nothing: the writer will create the next segment.
    Nothing,
}

/// Checks the link from segment `s` to what follows it.
fn check_link(s: &View<'_>, next: Link<'_, '_>) -> Option<Damage> {
    let damage =
        |offset: u64, expected: Seq, cause| Damage::at(offset, expected, cause, offset, false);
    match (s.seal, next) {
        (None, Link::Nothing) => None,
        // The writer seals `s` with the number the active segment names.
        (None, Link::Active(n))
            if n.prev_seq() > s.last_seq() && n.scan.id.first_seq() > n.prev_seq() =>
        {
            None
        }
        (None, Link::Active(n)) => Some(damage(
            0,
            s.last_seq().next(),
            Corruption::BrokenChain {
                expected_prev: s.last_seq(),
                found_prev: n.prev_seq(),
            },
        )),
        (None, Link::Segment(_)) => Some(damage(
            s.end(),
            s.last_seq().next(),
            Corruption::MissingSeal,
        )),
        // Sealed, but what followed is gone.
        (Some(seal), Link::Nothing) => Some(damage(
            u64::from(seal.offset),
            seal.seq.next(),
            Corruption::MissingSegment {
                expected_first: seal.seq.next(),
            },
        )),
        // The next segment names the seal's number as its predecessor and starts
        // after it (not always right after: numbers may be skipped, never reused).
        (Some(seal), Link::Segment(n) | Link::Active(n)) => {
            let prev = n.prev_seq();
            let seal = seal.seq;
            if prev > seal {
                Some(damage(
                    0,
                    seal.next(),
                    Corruption::MissingSegment {
                        expected_first: seal.next(),
                    },
                ))
            } else if n.scan.id.first_seq() <= seal || prev != seal {
                Some(damage(
                    0,
                    seal.next(),
                    Corruption::BrokenChain {
                        expected_prev: seal,
                        found_prev: prev,
                    },
                ))
            } else {
                None
            }
        }
    }
}

#[cfg(test)]
#[expect(
    clippy::indexing_slicing,
    reason = "tests damage bytes at known offsets"
)]
mod tests;
