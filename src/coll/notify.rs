//! Notified requests and the progress thread that completes them (`Comm::notify`).
//!
//! A request handed to `notify` completes by itself: the communicator's progress thread,
//! started at the first notify, drives `progress` as `Comm::wait` does (poll while something
//! moves, then sleep on the transport's wait object in short slices) for as long as a notified
//! request is pending, and parks on a condition variable (no CPU) otherwise. Each callback runs
//! exactly once, with the request's final status, after the engine's lock is released (so that
//! it may call into the same communicator): in the progress thread, or in the caller's thread
//! when the request had already ended. The thread holds the communicator only weakly between
//! rounds: dropping the last `Arc<Comm>` stops and joins it, and fails the notified requests
//! still pending.
use super::engine::{Engine, ReqState, SLEEP_SLICE};
use super::{Comm, RequestId};
use crate::error::{Error, Result};
use crate::exec::Idle;
use crate::transport::WaitObject;
use parking_lot::{Condvar, Mutex};
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// What runs when a notified request ends: called exactly once with its final status.
pub type Callback = Box<dyn FnOnce(Result<()>) + Send>;

/// The callbacks of the notified requests, by request id (kept in the engine, under its lock).
pub(super) type Notified = FxHashMap<u32, Callback>;

/// A communicator's progress thread and what wakes it.
#[derive(Default)]
pub(super) struct Notifier {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// What the communicator and its progress thread share (the thread holds no strong reference
/// to the communicator while it is parked).
#[derive(Default)]
struct Shared {
    /// Set by `notify` when it hands a request over; the thread clears it before each drive.
    work: Mutex<bool>,
    wake: Condvar,
    shutdown: AtomicBool,
}

/// Longest park without a wake-up: the thread re-checks the shutdown flag at least this often
/// (a wait with a deadline, though `stop` also wakes it).
const PARK_SLICE: Duration = Duration::from_secs(1);

/// The first nap of an idle progress thread where the transport has no wait object (doubled
/// each idle round up to `NAP_MAX`): short, as a message may arrive any moment.
const NAP_MIN: Duration = Duration::from_micros(20);

/// The longest nap: a notified request waits for peers that are still computing (DDP's
/// buckets), so a nap is added to the request's latency; the thread naps only while a
/// notified request is pending.
const NAP_MAX: Duration = Duration::from_micros(200);

/// Callbacks ready to run, with their statuses.
type Ready = Vec<(Callback, Result<()>)>;

thread_local! {
    /// The communicators (by address) whose callbacks this thread is running now, innermost
    /// last: a callback may call into its communicator, but must not destroy it.
    static IN_CALLBACK: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Run `f` (callbacks of `comm`) with `comm` marked as in a callback on this thread.
pub(super) fn as_callback_of<T>(comm: &Comm, f: impl FnOnce() -> T) -> T {
    let me = comm as *const Comm as usize;
    IN_CALLBACK.with(|v| v.borrow_mut().push(me));
    // Unmarked on the way out, a panicking callback included.
    struct Unmark;
    impl Drop for Unmark {
        fn drop(&mut self) {
            IN_CALLBACK.with(|v| v.borrow_mut().pop());
        }
    }
    let _unmark = Unmark;
    f()
}

fn run_all(comm: &Comm, ready: Ready) {
    as_callback_of(comm, || {
        for (cb, r) in ready {
            cb(r);
        }
    });
}

impl Comm {
    /// Hand the pending request `req` over: `callback` runs exactly once when it ends (in the
    /// progress thread), or at once in this thread when it has already ended. Afterwards the
    /// request is no longer the caller's: `test` and `wait` on it are errors. An unknown
    /// request is an error naming 'request' (the callback is dropped uncalled).
    pub fn notify(self: &Arc<Self>, req: RequestId, callback: Callback) -> Result<()> {
        let id = u32::try_from(req)
            .map_err(|_| Error::arg("request", "not a request of this communicator"))?;
        let mut e = self.engine.lock();
        if e.notified.contains_key(&id) {
            return Err(Error::arg("request", "already handed to notify"));
        }
        let ended = match e.execs.get(&id) {
            None => {
                return Err(Error::arg(
                    "request",
                    "not a pending request of this communicator",
                ))
            }
            Some(ReqState::Running(_)) => None,
            Some(_) => Some(take_ended(&mut e, id)),
        };
        match ended {
            Some(r) => {
                drop(e);
                as_callback_of(self, || callback(r));
            }
            None => {
                // Started before the callback is taken: where it cannot start, the request
                // stays the caller's.
                self.notifier.start(self)?;
                e.notified.insert(id, callback);
                drop(e);
                self.notifier.wake();
            }
        }
        Ok(())
    }

    /// Whether this thread is running one of this communicator's notify callbacks now (where
    /// destroying the communicator is forbidden: its progress thread holds it).
    pub fn in_own_callback(&self) -> bool {
        let me = self as *const Comm as usize;
        IN_CALLBACK.with(|v| v.borrow().contains(&me))
    }

    /// One round of the progress thread: progress, then take the notified requests that ended
    /// (their callbacks run once the lock is released). None when no notified request is left.
    fn notify_round(&self) -> Option<(bool, Ready)> {
        let mut e = self.engine.lock();
        if e.notified.is_empty() {
            return None;
        }
        let moved = match self.progress(&mut e) {
            Ok(m) => m,
            Err(err) => {
                // The transport failed: no notified request can end otherwise.
                self.fail_notified(&mut e, &err);
                true
            }
        };
        let ended: Vec<u32> = e
            .notified
            .keys()
            .copied()
            .filter(|id| !matches!(e.execs.get(id), Some(ReqState::Running(_))))
            .collect();
        let ready = ended
            .into_iter()
            .filter_map(|id| {
                let r = take_ended(&mut e, id);
                e.notified.remove(&id).map(|cb| (cb, r))
            })
            .collect();
        Some((moved, ready))
    }

    /// Fail every notified request still running with `err` (their memory goes to the
    /// graveyard while operations may still touch it).
    fn fail_notified(&self, e: &mut Engine, err: &Error) {
        let ids: Vec<u32> = e.notified.keys().copied().collect();
        for id in ids {
            self.fail_running(e, id, err);
        }
    }

    /// Fail request `id` with `err` if it is still running (an ended one keeps its status).
    fn fail_running(&self, e: &mut Engine, id: u32, err: &Error) {
        if !matches!(e.execs.get(&id), Some(ReqState::Running(_))) {
            return;
        }
        if let Some(ReqState::Running(x)) = e.execs.remove(&id) {
            let err = x.explain(err.clone());
            let keep = x.fail(&*self.transport, &self.peers);
            e.graveyard.extend(keep);
            e.bury_phased(id);
            e.execs.insert(id, ReqState::Failed(err));
        }
    }

    /// At drop: stop the progress thread and end the notified requests still pending (those
    /// still running fail: the communicator is gone).
    pub(super) fn end_notified(&self) {
        self.notifier.stop();
        let mut e = self.engine.lock();
        if e.notified.is_empty() {
            return;
        }
        let gone = Error::InvalidUsage(
            "the communicator was destroyed before the request completed".into(),
        );
        let ids: Vec<u32> = e.notified.keys().copied().collect();
        let mut ready = Vec::with_capacity(ids.len());
        for id in ids {
            self.fail_running(&mut e, id, &gone);
            let r = take_ended(&mut e, id);
            if let Some(cb) = e.notified.remove(&id) {
                ready.push((cb, r));
            }
        }
        drop(e);
        run_all(self, ready);
    }
}

/// Remove the ended (done or failed) request `id` from the table: its final status.
fn take_ended(e: &mut Engine, id: u32) -> Result<()> {
    match e.execs.remove(&id) {
        Some(ReqState::Done) => Ok(()),
        Some(ReqState::Failed(err)) => Err(err),
        Some(ReqState::Running(_)) | None => {
            Err(Error::Internal(format!("request {id} had not ended")))
        }
    }
}

impl Notifier {
    /// Start the progress thread, at the first call.
    fn start(&self, comm: &Arc<Comm>) -> Result<()> {
        let mut t = self.thread.lock();
        if t.is_none() {
            let shared = self.shared.clone();
            let weak = Arc::downgrade(comm);
            let h = std::thread::Builder::new()
                .name(format!("fabricoll-progress-{}", comm.rank))
                .spawn(move || progress_thread(&shared, &weak))
                .map_err(|e| Error::System(format!("cannot start the progress thread: {e}")))?;
            *t = Some(h);
        }
        Ok(())
    }

    /// Tell the progress thread that a request was handed over.
    fn wake(&self) {
        *self.shared.work.lock() = true;
        self.shared.wake.notify_one();
    }

    /// Stop the progress thread and join it, unless this is that thread (the communicator's
    /// last reference was its own): then it ends by itself after this round.
    fn stop(&self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _w = self.shared.work.lock();
            self.shared.wake.notify_all();
        }
        let handle = self.thread.lock().take();
        if let Some(h) = handle {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }

    /// Whether the progress thread is running (for tests).
    #[cfg(test)]
    pub(super) fn started(&self) -> bool {
        self.thread.lock().is_some()
    }
}

/// The progress thread: park until a request is handed over, then drive the communicator
/// until no notified request is left, holding it only for one round at a time.
fn progress_thread(shared: &Shared, comm: &Weak<Comm>) {
    loop {
        {
            let mut w = shared.work.lock();
            while !*w && !shared.shutdown.load(Ordering::SeqCst) {
                shared.wake.wait_for(&mut w, PARK_SLICE);
            }
            *w = false;
        }
        if shared.shutdown.load(Ordering::SeqCst) {
            return;
        }
        let mut idle: Option<Idle> = None;
        let mut nap = NAP_MIN;
        loop {
            let Some(c) = comm.upgrade() else { return };
            if shared.shutdown.load(Ordering::SeqCst) {
                return;
            }
            let Some((moved, ready)) = c.notify_round() else {
                break;
            };
            let idle = idle.get_or_insert_with(|| Idle::new(c.spin, c.poll));
            let ended = !ready.is_empty();
            run_all(&c, ready);
            if moved || ended {
                idle.moved();
                nap = NAP_MIN;
            } else if !idle.expired() {
                idle.pause();
            } else {
                // Idle past the polling window: every round from now on sleeps until something
                // moves. Where the transport has nothing to sleep on (shm's fastbox frames
                // raise no completion) the thread naps, a little longer each round.
                match c.transport.wait_object() {
                    WaitObject::Ready => {}
                    WaitObject::Yield => {
                        drop(c);
                        std::thread::sleep(nap);
                        nap = (nap * 2).min(NAP_MAX);
                    }
                    // A failing wait only shortens the sleep: the next round's poll reports it.
                    WaitObject::Fd(_) => {
                        let _ = c.transport.wait(SLEEP_SLICE);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Collective;
    use crate::config::Config;
    use crate::reduce::{DataType, RedOp};
    use crate::transport::loopback::LoopbackFabric;
    use crate::transport::{Region, Transport};
    use std::sync::atomic::AtomicUsize;

    fn pair() -> Vec<Arc<Comm>> {
        let cfg = Config::from_lookup(|_| None).unwrap();
        let f = LoopbackFabric::new();
        let eps: Vec<Arc<dyn Transport>> = (0..2)
            .map(|_| Arc::new(f.endpoint()) as Arc<dyn Transport>)
            .collect();
        let addrs: Vec<Vec<u8>> = eps.iter().map(|e| e.address()).collect();
        (0..2)
            .map(|r| Arc::new(Comm::new(r, eps[r].clone(), &addrs, &cfg).unwrap()))
            .collect()
    }

    fn allreduce(buf: &mut [u8; 8]) -> super::super::Call {
        let p = buf.as_mut_ptr();
        // SAFETY: the buffer outlives the request (the test waits for its callback).
        let (send, recv) = unsafe { (Region::from_raw(p, 4), Region::from_raw(p.add(4), 4)) };
        super::super::Call {
            kind: super::super::Kind::Coll(Collective::AllReduce),
            send,
            recv,
            count: 1,
            dtype: DataType::Int32,
            op: RedOp::Sum,
            root: 0,
            algo: None,
        }
    }

    /// The thread starts at the first notify, reports an abort once, parks, and is joined
    /// when the communicator goes (nothing keeps the communicator alive).
    #[test]
    fn thread_starts_at_first_notify_and_ends_with_the_communicator() {
        let cs = pair();
        assert!(!cs[0].notifier.started());
        let mut buf = [0u8; 8];
        let calls = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = std::sync::mpsc::channel();
        // Rank 1 never joins: the request stays pending until the abort.
        let id = cs[0].start(&allreduce(&mut buf)).unwrap();
        let n = calls.clone();
        let cb: Callback = Box::new(move |r| {
            n.fetch_add(1, Ordering::SeqCst);
            tx.send(r.is_err()).unwrap();
        });
        cs[0].notify(id, cb).unwrap();
        assert!(cs[0].notifier.started());
        cs[0].abort();
        assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap());
        assert_eq!(cs[0].pending(), 0);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let weak = Arc::downgrade(&cs[0]);
        drop(cs);
        // The thread lets go once the round that ran the callback ends.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while weak.upgrade().is_some() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            weak.upgrade().is_none(),
            "the thread holds no reference when parked"
        );
    }
}
