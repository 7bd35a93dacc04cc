//! The hardware work queues of an emulated context. A GPU runs a context's streams on a few
//! hardware queues (`CUDA_DEVICE_MAX_CONNECTIONS`, 8 unless set before the context is made, 32
//! at most), each stream on one of them, assigned round-robin as streams are created. A queue
//! hands its operations to the device in the order they were enqueued, whatever stream they
//! came from: an operation cannot start until every operation enqueued earlier on its queue has
//! started, and a wait (for a flag or an event) starts only once it is satisfied. So a flag
//! wait holds back every stream behind it on its queue, not only its own: the hazard the
//! stream-ordered calls must not meet (docs/device-calls.md, "Hardware queues").
//!
//! Each operation takes a ticket from its stream's queue when it is enqueued (`ticket`); the
//! stream's worker waits for its turn (`wait_turn`: every earlier ticket started), then marks
//! it started (`start`) before running it, or, for a wait, once the wait is satisfied.
use std::collections::BTreeSet;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// One hardware queue.
pub(super) struct HwQueue {
    index: usize,
    state: Mutex<Tickets>,
    cv: Condvar,
}

#[derive(Default)]
struct Tickets {
    /// The next ticket handed out.
    next: u64,
    /// Every ticket below this one has started.
    started: u64,
    /// Tickets at or above `started` that have started out of turn (an operation skipped after
    /// its stream failed, or one that gave up waiting for its turn).
    early: BTreeSet<u64>,
}

impl HwQueue {
    pub(super) fn new(index: usize) -> Arc<HwQueue> {
        Arc::new(HwQueue {
            index,
            state: Mutex::new(Tickets::default()),
            cv: Condvar::new(),
        })
    }

    /// The queue's number in its context (for errors).
    pub(super) fn index(&self) -> usize {
        self.index
    }

    fn lock(&self) -> MutexGuard<'_, Tickets> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The ticket of an operation enqueued now.
    pub(super) fn ticket(&self) -> u64 {
        let mut t = self.lock();
        t.next += 1;
        t.next - 1
    }

    /// Waits until every operation enqueued on the queue before `ticket` has started, at most
    /// `limit`: whether they have.
    pub(super) fn wait_turn(&self, ticket: u64, limit: Duration) -> bool {
        let (t, _) = self
            .cv
            .wait_timeout_while(self.lock(), limit, |t| t.started < ticket)
            .unwrap_or_else(|p| p.into_inner());
        t.started >= ticket
    }

    /// Marks `ticket` started (once per ticket).
    pub(super) fn start(&self, ticket: u64) {
        let mut t = self.lock();
        if ticket >= t.started {
            t.early.insert(ticket);
        }
        while let Some(&first) = t.early.first() {
            if first != t.started {
                break;
            }
            t.early.pop_first();
            t.started += 1;
        }
        self.cv.notify_all();
    }
}

/// A context's queues and the round-robin assignment of its streams.
pub(super) struct Queues {
    queues: Vec<Arc<HwQueue>>,
    next: usize,
}

impl Queues {
    /// `n` queues (at least 1).
    pub(super) fn new(n: usize) -> Queues {
        Queues {
            queues: (0..n.max(1)).map(HwQueue::new).collect(),
            next: 0,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.queues.len()
    }

    /// The queue of a stream created now: the next one round-robin.
    pub(super) fn assign(&mut self) -> Arc<HwQueue> {
        let q = self.queues[self.next % self.queues.len()].clone();
        self.next = self.next.wrapping_add(1);
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(10);

    #[test]
    fn an_operation_waits_for_every_earlier_one_to_start() {
        let q = HwQueue::new(0);
        let (a, b, c) = (q.ticket(), q.ticket(), q.ticket());
        assert_eq!((a, b, c), (0, 1, 2));
        assert!(q.wait_turn(a, LONG));
        // b's turn comes only once a has started.
        assert!(!q.wait_turn(b, Duration::from_millis(20)));
        q.start(a);
        assert!(q.wait_turn(b, LONG));
        // c started out of turn (skipped): b still holds the queue for later tickets.
        q.start(c);
        let d = q.ticket();
        assert!(!q.wait_turn(d, Duration::from_millis(20)));
        q.start(b);
        assert!(q.wait_turn(d, LONG));
    }

    #[test]
    fn a_turn_comes_when_another_thread_starts_the_earlier_operation() {
        let q = HwQueue::new(0);
        let (a, b) = (q.ticket(), q.ticket());
        let q2 = q.clone();
        let t = std::thread::spawn(move || q2.wait_turn(b, LONG));
        std::thread::sleep(Duration::from_millis(10));
        q.start(a);
        assert!(t.join().unwrap());
    }

    #[test]
    fn streams_are_spread_round_robin() {
        let mut qs = Queues::new(3);
        let got: Vec<usize> = (0..7).map(|_| qs.assign().index()).collect();
        assert_eq!(got, [0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(Queues::new(0).len(), 1);
    }
}
