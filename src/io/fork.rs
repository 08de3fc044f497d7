//! Forks of the process: an outbox belongs to the process that opened it. A
//! child made by `fork(2)` inherits its memory and descriptors but none of
//! its threads (the writer among them) and shares its directory lock, so the
//! child must neither write nor release anything. The child handler counts
//! forks; an outbox notes the count at its open and refuses every call in a
//! process whose count differs (`Error::Forked`).

use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

/// Forks this process is the child of, since the handler was registered.
static GENERATION: AtomicU64 = AtomicU64::new(0);
static WATCH: Once = Once::new();

/// Runs in the child just after `fork`: only an atomic increment, which is
/// async-signal-safe.
extern "C" fn in_child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// Starts counting forks (once per process); the count now.
pub(crate) fn watch() -> u64 {
    #[expect(unsafe_code, reason = "pthread_atfork(3) has no wrapper in std")]
    WATCH.call_once(|| {
        // SAFETY: registers a handler that runs in the child after each
        // fork; it touches nothing but an atomic in a static, and it stays
        // valid for the life of the process. Registration can fail only for
        // want of memory, in which case forks are not seen (as before this
        // watch existed).
        unsafe {
            libc::pthread_atfork(None, None, Some(in_child));
        }
    });
    current()
}

/// The number of forks seen: an outbox opened at another count was opened
/// by an ancestor of this process.
pub(crate) fn current() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}
