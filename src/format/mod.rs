//! The on-disk format as pure codecs: functions over byte slices, no I/O.
//!
//! Owns the byte layout of everything segwal writes: frames (`frame`, and
//! `frames`, a segment's list of them as recovery keeps it), the
//! segment header (`segment`), the seal index (`seal`), the index
//! checkpoints of a segment being written (`checkpoint`), the payloads of
//! delivery-state frames (`acks`, `delivery`), relocated records
//! (`relocated`), what producers said of their records (`fields`), the
//! digests that name ids and keys (`hash`), and the identities
//! that name files and frames (`seq`). The layout is documented once, in
//! `docs/FORMAT.md`; the offsets here chain from each other and point to it.
//!
//! May not touch: files, the clock, threads, or anything else outside its input
//! slices. Decoding never panics and allocates only what checked lengths bound.

pub(crate) mod acks;
pub(crate) mod checkpoint;
pub(crate) mod delivery;
pub(crate) mod ext;
pub(crate) mod fields;
pub(crate) mod frame;
pub(crate) mod frames;
pub(crate) mod hash;
pub(crate) mod relocated;
pub(crate) mod seal;
pub(crate) mod segment;
pub(crate) mod seq;

/// The `N` bytes at `at` of a fixed-size header (zeros if out of range, which the
/// constant offsets of the codecs never are).
pub(crate) fn field<const N: usize>(header: &[u8], at: usize) -> [u8; N] {
    header
        .get(at..at.saturating_add(N))
        .and_then(|b| <[u8; N]>::try_from(b).ok())
        .unwrap_or([0; N])
}
