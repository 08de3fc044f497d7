//! The deadlines of `claim_wait_async`: a task waiting for records also waits
//! for its timeout, or for a lease to run out (whose record then comes back).
//! The crate depends on no async runtime, so it keeps its own timer: one
//! thread per outbox, started by the first async wait with a deadline, that
//! sleeps until the earliest deadline and wakes the tasks whose time came.
//!
//! Few tasks wait at once (relays, not producers), so the deadlines are a
//! plain vector scanned in full.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Waker;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

/// One outbox's timer thread and its deadlines.
pub(crate) struct Timers {
    state: Mutex<State>,
    changed: Condvar,
    next_id: AtomicU64,
}

#[derive(Default)]
struct State {
    /// (deadline, timer id, task).
    entries: Vec<(Instant, u64, Waker)>,
    stopped: bool,
}

impl Timers {
    /// Starts the thread; `None` if the system refuses one.
    pub(crate) fn start() -> Option<Arc<Timers>> {
        let timers = Arc::new(Timers {
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            next_id: AtomicU64::new(1),
        });
        let run = timers.clone();
        std::thread::Builder::new()
            .name("segwal-timer".into())
            .spawn(move || {
                crate::log::shared::mark_own_thread();
                run.run()
            })
            .ok()?;
        Some(timers)
    }

    /// Wakes `waker` at `at` (at once if it has passed, or if the timers
    /// are stopped: the outbox closed). Returns the timer's id, for
    /// [`cancel`](Timers::cancel).
    pub(crate) fn wake_at(&self, at: Instant, waker: &Waker) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut state = self.state.lock();
        if state.stopped {
            drop(state);
            waker.wake_by_ref();
            return id;
        }
        let earliest = state.entries.iter().all(|(t, ..)| at < *t);
        state.entries.push((at, id, waker.clone()));
        drop(state);
        if earliest {
            self.changed.notify_one();
        }
        id
    }

    /// Forgets the timer `id` (fired or not).
    pub(crate) fn cancel(&self, id: u64) {
        self.state.lock().entries.retain(|(_, i, _)| *i != id);
    }

    /// Stops the thread, waking every task still waiting (each then sees the
    /// outbox closed).
    pub(crate) fn stop(&self) {
        let woken = {
            let mut state = self.state.lock();
            state.stopped = true;
            std::mem::take(&mut state.entries)
        };
        self.changed.notify_one();
        for (_, _, w) in woken {
            w.wake();
        }
    }

    fn run(&self) {
        let mut state = self.state.lock();
        loop {
            if state.stopped {
                return;
            }
            let now = Instant::now();
            let mut due = Vec::new();
            state.entries.retain(|(at, _, w)| {
                let fired = *at <= now;
                if fired {
                    due.push(w.clone());
                }
                !fired
            });
            if !due.is_empty() {
                drop(state);
                for w in due {
                    w.wake();
                }
                state = self.state.lock();
                continue;
            }
            match state.entries.iter().map(|(at, ..)| *at).min() {
                Some(next) => {
                    self.changed.wait_until(&mut state, next);
                }
                None => self.changed.wait(&mut state),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;
    use std::time::Duration;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A deadline given to stopped timers (the outbox closed meanwhile)
    /// wakes its task at once: no thread is left to wake it later.
    #[test]
    fn a_deadline_set_after_the_stop_wakes_at_once() {
        let timers = Timers::start().expect("timer thread");
        timers.stop();
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(count.clone());
        timers.wake_at(Instant::now() + Duration::from_secs(3600), &waker);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }
}
