//! Identities: [`Seq`], the sequence number of a frame, and [`SegmentId`], the name
//! of a segment file.

use std::fmt;

/// Bound of the sequence numbers the format allows: a frame's seq is below it
/// (and a file name at most equal to it, naming the segment after the highest
/// frame). Far beyond any real log, it keeps every `seq + n` in range whatever a
/// damaged file holds.
pub(crate) const SEQ_MAX: u64 = 1 << 62;

/// The sequence number of a record: its identity in the whole API.
///
/// Assigned by the writer (one batch at a time), strictly increasing, stored in the record's frame,
/// stable across restarts and never reused. Sequence numbers start at 1. They are
/// increasing but not always contiguous from one append to the next: the writer
/// also numbers the few internal frames it writes (see `docs/FORMAT.md`), and a
/// lossy recovery skips the numbers it dropped. The records of one
/// [`Outbox::append_batch`](crate::Outbox::append_batch) call are always contiguous.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
#[cfg_attr(feature = "json", derive(serde::Serialize), serde(transparent))]
pub struct Seq(u64);

impl Seq {
    /// The sequence number as a plain integer.
    pub const fn get(self) -> u64 {
        self.0
    }

    pub(crate) const fn next(self) -> Seq {
        Seq(self.0 + 1)
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<Seq> for u64 {
    fn from(seq: Seq) -> u64 {
        seq.0
    }
}

impl From<u64> for Seq {
    fn from(value: u64) -> Seq {
        Seq(value)
    }
}

/// The identity of a segment: the sequence number of its first frame.
///
/// A segment file is named after it, zero-padded to 20 digits, so that a directory
/// listing sorts in log order: `00000000000000000001.seg`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct SegmentId(pub(crate) u64);

impl SegmentId {
    /// The sequence number of the segment's first frame.
    pub const fn first_seq(self) -> Seq {
        Seq(self.0)
    }

    /// The file name of this segment.
    pub fn file_name(self) -> String {
        format!("{:020}{}", self.0, SEGMENT_SUFFIX)
    }

    /// The name the file has while it is being created: it takes
    /// [`file_name`](Self::file_name) only once its header is durable.
    pub(crate) fn creating_name(self) -> String {
        format!("{}{}", self.file_name(), CREATING_SUFFIX)
    }

    /// Parses the name of a segment whose creation had not finished; `None` for
    /// any other name.
    pub(crate) fn parse_creating(name: &str) -> Option<SegmentId> {
        SegmentId::parse(name.strip_suffix(CREATING_SUFFIX)?)
    }

    /// The name a fully acknowledged segment's file takes while it waits to
    /// be written again as a new segment (docs/FORMAT.md, "Recycled
    /// segments"): not a segment's name, so no recovery reads it as one.
    pub(crate) fn free_name(self) -> String {
        format!("{}{}", self.file_name(), FREE_SUFFIX)
    }

    /// Parses the name of a file kept for recycling; `None` for any other
    /// name.
    pub(crate) fn parse_free(name: &str) -> Option<SegmentId> {
        SegmentId::parse(name.strip_suffix(FREE_SUFFIX)?)
    }

    /// Parses a segment file name; `None` for any other name.
    pub(crate) fn parse(name: &str) -> Option<SegmentId> {
        let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
        if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok().filter(|&n| n <= SEQ_MAX).map(SegmentId)
    }
}

impl fmt::Display for SegmentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file_name())
    }
}

/// Suffix of segment file names.
pub(crate) const SEGMENT_SUFFIX: &str = ".seg";

/// Added to a segment's name while it is being created (docs/FORMAT.md,
/// "Creating a segment").
pub(crate) const CREATING_SUFFIX: &str = ".creating";

/// Added to a fully acknowledged segment's name while its file waits to be
/// recycled as a new segment (docs/FORMAT.md, "Recycled segments").
pub(crate) const FREE_SUFFIX: &str = ".free";

/// The folder inside an outbox directory where recovery moves files it must get
/// past but cannot prove it wrote, and what a lossy repair drops.
pub const QUARANTINE_DIR: &str = "quarantine";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_sort_in_log_order() {
        let mut names: Vec<String> = [1u64, 10, 9, 100_000, 2]
            .iter()
            .map(|&s| SegmentId(s).file_name())
            .collect();
        names.sort();
        let parsed: Vec<u64> = names
            .iter()
            .map(|n| SegmentId::parse(n).map(|id| id.0).unwrap_or(0))
            .collect();
        assert_eq!(parsed, vec![1, 2, 9, 10, 100_000]);
    }

    #[test]
    fn foreign_names_are_not_segments() {
        for name in [
            "LOCK",
            "1.seg",
            "0000000000000000000a.seg",
            "00000000000000000001.tmp",
        ] {
            assert_eq!(SegmentId::parse(name), None, "{name}");
        }
        assert_eq!(
            SegmentId::parse("00000000000000000042.seg"),
            Some(SegmentId(42))
        );
        // Beyond the format's largest sequence number: not a segment name.
        assert_eq!(SegmentId::parse("18446744073709551615.seg"), None);
        assert_eq!(SegmentId::parse("99999999999999999999.seg"), None);
    }
}
