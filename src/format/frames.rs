//! The frames of one segment as recovery lists them, in four bytes a frame.
//!
//! An open lists every frame of every segment it keeps (a million frames for
//! a million records), and in a new process each byte of those lists is
//! fresh memory the kernel faults in page by page. [`FrameList`] keeps what
//! a list of [`FrameSpan`]s says in the shape the state table keeps it: each
//! frame's offset, the few frames not followed right away by the next one
//! (the last frame of a sync group, whose successor starts on the next
//! block), and the positions of the internal frames. A frame's length is
//! where the next one starts, or where its gap says it ends; the table takes
//! the offsets as they are, with no copy (docs/BENCHMARKS.md, "Cold open in
//! a fresh process: sealed segments listed in four bytes a frame").
//!
//! Every list of the same frames is the same value, however it was built
//! (pushed frame by frame, decoded from a seal index or checkpoints, or cut
//! back with [`FrameList::truncate`]), so lists compare with `==`.

#![deny(clippy::indexing_slicing)]

use crate::format::frame::FrameSpan;

/// The frames of a segment, in order: what a `Vec<FrameSpan>` would say, in
/// about four bytes a frame.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct FrameList {
    /// Byte offset of each frame, ascending.
    offsets: Vec<u32>,
    /// The frames that the next one does not follow right away: (position,
    /// the frame's end), by position. The last frame is never listed here:
    /// its end is `end`.
    gaps: Vec<(u32, u32)>,
    /// Positions of the internal frames, ascending.
    internal: Vec<u32>,
    /// The end of the last frame (0 for no frame).
    end: u32,
}

impl FrameList {
    /// An empty list.
    pub(crate) fn new() -> FrameList {
        FrameList::default()
    }

    /// An empty list with room for `frames` offsets.
    pub(crate) fn with_capacity(frames: usize) -> FrameList {
        FrameList {
            offsets: Vec::with_capacity(frames),
            ..FrameList::default()
        }
    }

    /// Makes room for `more` offsets.
    pub(crate) fn reserve(&mut self, more: usize) {
        self.offsets.reserve(more);
    }

    /// How many frames it lists.
    pub(crate) fn len(&self) -> usize {
        self.offsets.len()
    }

    /// Whether it lists no frame.
    pub(crate) fn is_empty(&self) -> bool {
        self.offsets.is_empty()
    }

    /// Adds the next frame. A frame that does not start where the last one
    /// ends is recorded as it is (callers check how frames may follow each
    /// other; the list only keeps what it is given).
    #[inline(always)]
    pub(crate) fn push(&mut self, span: FrameSpan) {
        let n = self.offsets.len();
        if n > 0 && span.offset != self.end {
            self.gaps.push(((n - 1) as u32, self.end));
        }
        if !span.is_record() {
            self.internal.push(n as u32);
        }
        self.offsets.push(span.offset);
        // Callers keep every frame below 4 GiB (its end fits in the u32
        // offsets the format uses); a saturated end would only make the
        // frame read as longer, and every caller checks the ends first.
        self.end = span.offset.saturating_add(span.len());
    }

    /// Marks the frame at `position` internal; false if there is none.
    pub(crate) fn set_internal(&mut self, position: usize) -> bool {
        if position >= self.offsets.len() {
            return false;
        }
        let p = position as u32;
        if let Err(k) = self.internal.binary_search(&p) {
            self.internal.insert(k, p);
        }
        true
    }

    /// The frame at `position`.
    pub(crate) fn get(&self, position: usize) -> Option<FrameSpan> {
        let offset = *self.offsets.get(position)?;
        let end = self.end_of_frame(position);
        let is_record = self.internal.binary_search(&(position as u32)).is_err();
        Some(FrameSpan::new(offset, end.wrapping_sub(offset), is_record))
    }

    /// The end of the frame at `position` (the end of the last frame for a
    /// position past it).
    fn end_of_frame(&self, position: usize) -> u32 {
        let gap = self
            .gaps
            .binary_search_by_key(&(position as u32), |&(p, _)| p)
            .ok()
            .and_then(|k| self.gaps.get(k));
        match gap {
            Some(&(_, end)) => end,
            None => self.offsets.get(position + 1).copied().unwrap_or(self.end),
        }
    }

    /// The last frame.
    pub(crate) fn last(&self) -> Option<FrameSpan> {
        self.get(self.offsets.len().checked_sub(1)?)
    }

    /// The end of the frame before position `n`, the `n`-th: just past the
    /// first `n` frames (`None` for `n` of 0 or beyond the list).
    pub(crate) fn end_of_first(&self, n: usize) -> Option<u64> {
        let last = n.checked_sub(1)?;
        (last < self.offsets.len()).then(|| u64::from(self.end_of_frame(last)))
    }

    /// Every frame, in order.
    pub(crate) fn iter(&self) -> Iter<'_> {
        self.range(0, self.offsets.len())
    }

    /// The frames at positions `from` to `to` (exclusive; both bounded by the
    /// list's length).
    pub(crate) fn range(&self, from: usize, to: usize) -> Iter<'_> {
        let to = to.min(self.offsets.len());
        let from = from.min(to);
        Iter {
            list: self,
            at: from,
            to,
            gap: self.gaps.partition_point(|&(p, _)| (p as usize) < from),
            internal: self.internal.partition_point(|&p| (p as usize) < from),
        }
    }

    /// The positions of the internal frames, ascending.
    pub(crate) fn internal(&self) -> &[u32] {
        &self.internal
    }

    /// How many of the first `n` frames are records.
    pub(crate) fn records_in_first(&self, n: usize) -> usize {
        let n = n.min(self.offsets.len());
        n - self.internal.partition_point(|&p| (p as usize) < n)
    }

    /// The position of the frame that starts at `offset`.
    pub(crate) fn position_of(&self, offset: u32) -> Option<usize> {
        self.offsets.binary_search(&offset).ok()
    }

    /// How many frames, from the first, end at or before `cut`.
    pub(crate) fn count_ending_by(&self, cut: u64) -> usize {
        self.iter().take_while(|f| f.end() <= cut).count()
    }

    /// Keeps the first `n` frames.
    pub(crate) fn truncate(&mut self, n: usize) {
        if n >= self.offsets.len() {
            return;
        }
        self.end = match n.checked_sub(1) {
            Some(last) => self.end_of_frame(last),
            None => 0,
        };
        self.offsets.truncate(n);
        let keep = self.gaps.partition_point(|&(p, _)| (p as usize) + 1 < n);
        self.gaps.truncate(keep);
        let keep = self.internal.partition_point(|&p| (p as usize) < n);
        self.internal.truncate(keep);
    }

    /// The offset of each frame, in order.
    pub(crate) fn offsets(&self) -> &[u32] {
        &self.offsets
    }

    /// The frames the next one does not follow right away, as (position,
    /// the frame's end), by position; never the last frame.
    pub(crate) fn gaps(&self) -> &[(u32, u32)] {
        &self.gaps
    }

    /// The end of the last frame (0 for an empty list).
    pub(crate) fn end(&self) -> u32 {
        self.end
    }

    /// The offsets of the frames, in order, for the state table, which keeps
    /// them as they are.
    pub(crate) fn into_offsets(self) -> Vec<u32> {
        self.offsets
    }
}

impl FromIterator<FrameSpan> for FrameList {
    fn from_iter<I: IntoIterator<Item = FrameSpan>>(iter: I) -> FrameList {
        let mut list = FrameList::new();
        for span in iter {
            list.push(span);
        }
        list
    }
}

impl std::fmt::Debug for FrameList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// The frames of a [`FrameList`], in order, each as a [`FrameSpan`].
#[derive(Clone)]
pub(crate) struct Iter<'a> {
    list: &'a FrameList,
    at: usize,
    to: usize,
    /// The next gap at or after `at`.
    gap: usize,
    /// The next internal position at or after `at`.
    internal: usize,
}

impl Iterator for Iter<'_> {
    type Item = FrameSpan;

    fn next(&mut self) -> Option<FrameSpan> {
        if self.at >= self.to {
            return None;
        }
        let list = self.list;
        let i = self.at;
        let offset = *list.offsets.get(i)?;
        let end = match list.gaps.get(self.gap) {
            Some(&(p, end)) if p as usize == i => {
                self.gap += 1;
                end
            }
            _ => list.offsets.get(i + 1).copied().unwrap_or(list.end),
        };
        let is_record = if list.internal.get(self.internal) == Some(&(i as u32)) {
            self.internal += 1;
            false
        } else {
            true
        };
        self.at += 1;
        Some(FrameSpan::new(offset, end.wrapping_sub(offset), is_record))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.to - self.at;
        (n, Some(n))
    }
}

impl ExactSizeIterator for Iter<'_> {}

#[cfg(test)]
#[expect(clippy::indexing_slicing, reason = "tests slice their own spans")]
mod tests {
    use super::*;

    /// Frames in sync groups of three, a gap to the next 4 KiB block after
    /// each group, every fifth frame internal.
    fn spans(n: u32) -> Vec<FrameSpan> {
        let mut at = 4096u32;
        let mut out = Vec::new();
        for i in 0..n {
            if i > 0 && i % 3 == 0 {
                at = at.next_multiple_of(4096);
            }
            let len = 48 + 13 * (i % 7) + 300;
            out.push(FrameSpan::new(at, len, i % 5 != 4));
            at += len;
        }
        out
    }

    #[test]
    fn a_list_says_what_its_spans_say() {
        for n in [0u32, 1, 2, 3, 4, 5, 17, 100] {
            let spans = spans(n);
            let list: FrameList = spans.iter().copied().collect();
            assert_eq!(list.len(), spans.len());
            assert_eq!(list.iter().collect::<Vec<_>>(), spans, "{n} frames");
            for (i, s) in spans.iter().enumerate() {
                assert_eq!(list.get(i), Some(*s), "frame {i} of {n}");
                assert_eq!(list.position_of(s.offset), Some(i));
                assert_eq!(list.end_of_first(i + 1), Some(s.end()));
                assert_eq!(
                    list.range(i, spans.len()).collect::<Vec<_>>(),
                    spans[i..],
                    "from {i} of {n}"
                );
                let records = spans[..i].iter().filter(|f| f.is_record()).count();
                assert_eq!(list.records_in_first(i), records);
                assert_eq!(
                    list.count_ending_by(s.end()),
                    i + 1,
                    "frames ending by frame {i}'s end"
                );
            }
            assert_eq!(list.get(spans.len()), None);
            assert_eq!(list.last(), spans.last().copied());
            assert_eq!(list.end_of_first(0), None);
        }
    }

    #[test]
    fn a_list_cut_back_is_the_list_of_its_first_frames() {
        let spans = spans(40);
        for n in 0..=spans.len() + 1 {
            let mut cut: FrameList = spans.iter().copied().collect();
            cut.truncate(n);
            let fresh: FrameList = spans.iter().take(n).copied().collect();
            assert_eq!(cut, fresh, "cut to {n}");
            assert_eq!(cut.iter().collect::<Vec<_>>(), spans[..n.min(40)]);
            // It grows again as a list pushed frame by frame does.
            let next = FrameSpan::new(1 << 20, 100, n % 2 == 0);
            let mut grown = cut.clone();
            grown.push(next);
            let mut pushed = fresh;
            pushed.push(next);
            assert_eq!(grown, pushed);
        }
    }

    #[test]
    fn internal_frames_marked_afterwards_are_the_same_list() {
        let spans = spans(30);
        let direct: FrameList = spans.iter().copied().collect();
        let mut marked: FrameList = spans
            .iter()
            .map(|s| FrameSpan::new(s.offset, s.len(), true))
            .collect();
        // In any order, some twice.
        for (i, s) in spans.iter().enumerate().rev() {
            if !s.is_record() {
                assert!(marked.set_internal(i));
                assert!(marked.set_internal(i));
            }
        }
        assert!(!marked.set_internal(spans.len()));
        assert_eq!(marked, direct);
    }

    #[test]
    fn a_list_takes_four_bytes_a_frame_when_groups_are_large() {
        // 64 frames to a sync group, one internal frame each: the gaps and
        // the internal positions add an eighth of a byte a frame.
        let mut list = FrameList::new();
        let mut at = 4096u32;
        for i in 0..64 * 64u32 {
            if i > 0 && i % 64 == 0 {
                at = at.next_multiple_of(4096);
            }
            list.push(FrameSpan::new(at, 304, i % 64 != 63));
            at += 304;
        }
        let bytes = 4 * list.offsets.len() + 8 * list.gaps.len() + 4 * list.internal.len();
        assert_eq!(list.len(), 4096);
        assert!(bytes <= 4096 * 4 + 4096 * 4 / 8, "{bytes} bytes");
    }
}
