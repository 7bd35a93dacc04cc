//! A communicator's device calls as the C API makes them (`Streams`): blocking (`run`),
//! non-blocking and grouped (`start`, then `test`, `wait` or `notify`), and stream-ordered
//! (`submit`); the host calls' turn after them (`settle`); and the worker thread that advances
//! the calls in flight while nobody waits for them (`inflight` holds the calls and the step).
//!
//! A stream-ordered call returns at once, once it has a slot (`slots`, in `staging`): it enqueues its whole
//! copy schedule on the caller's stream and no other (`staged`): per slice, the copy in, an
//! event (staged), a wait for its slot's flag to reach the number of that use, the copy out.
//! On the direct path (`direct`) it takes a flag slot and enqueues the same without the copies:
//! the event (the stream has reached the call: its host-engine call may start), the flag wait
//! (written once that call has finished), and the event after.
//! A call that fails releases its stream the same way; its error is kept (`error`), and every later
//! stream-ordered call on the communicator fails with it at once. The worker starts at the
//! first call that returns before it ends (non-blocking, grouped, stream-ordered, notified)
//! and stops when the communicator is destroyed (`shutdown`). docs/device-calls.md says why
//! the stream waits on a flag.
use super::inflight::{earlier, Channel, End, Entry, Finish, Inflight};
use super::pool::Slot;
use super::staged::Pipeline;
use super::DevCall;
use crate::coll::{Callback, Comm, Kind};
use crate::device::{Device, Stream};
use crate::error::{Error, Result};
use parking_lot::{Condvar, Mutex};
use staging::pool_of;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

mod staging;

/// The longest sleep of a waiter or the worker between rounds without progress (the copies
/// and the fabric make progress without them, but the next slice waits for a step).
const MAX_NAP: Duration = Duration::from_micros(200);

/// Longest park of an idle worker: it re-checks the shutdown flag at least this often.
const PARK: Duration = Duration::from_secs(1);

/// A communicator's device state: its calls in flight and their worker.
#[derive(Default)]
pub struct Streams {
    inner: Arc<Inner>,
    worker: Mutex<Option<JoinHandle<()>>>,
    /// Per device ordinal, whether calls go direct: what the direct calls share, or None
    /// (staged). Decided at the first device call on the device, before its staging is made
    /// (`direct::decide`).
    direct: Mutex<Vec<(i32, Option<Arc<super::direct::Ctx>>)>>,
    /// How many calls took the direct path (`direct_calls`).
    direct_calls: std::sync::atomic::AtomicU64,
    /// Whether the path of its stream-ordered calls was logged (`log_stream_path`).
    stream_logged: AtomicBool,
}

#[derive(Default)]
struct Inner {
    calls: Mutex<Inflight>,
    /// Set when a call that the worker should advance was added.
    work: Mutex<bool>,
    wake: Condvar,
    shutdown: AtomicBool,
}

impl Streams {
    /// Runs a device call to completion in the calling thread (advancing the calls in flight
    /// before it too).
    pub fn run(&self, comm: &Arc<Comm>, call: DevCall) -> Result<()> {
        let id = self.add(comm, call)?;
        self.wait(comm, id)
    }

    /// Starts a device call and returns its request (`test`, `wait`, `notify`); the worker
    /// advances it meanwhile.
    pub fn start(&self, comm: &Arc<Comm>, call: DevCall) -> Result<u64> {
        let id = self.add(comm, call)?;
        self.background(comm)?;
        Ok(id)
    }

    /// Adds a call with a slot of its own: a free one, where no earlier call waits for one;
    /// else one allocated in this thread (see `inflight`'s doc).
    fn add(&self, comm: &Arc<Comm>, call: DevCall) -> Result<u64> {
        let dev = call.device().clone();
        let direct = self.direct(comm, &dev);
        // Where calls go direct, a staged one allocates its slot as it needs it (below).
        self.prepare(&dev, true, direct.is_none(), false)?;
        let mut pipe = Pipeline::new(comm, call, None, direct)?;
        let need = pipe.need();
        let mut c = self.inner.calls.lock();
        if pipe.is_direct() {
            self.direct_calls.fetch_add(1, Ordering::Relaxed);
            let id = c.next_id();
            c.push(Entry::new(id, pipe, End::Request(None)));
            return Ok(id);
        }
        let wait_first = c.wants_slot();
        let pool = pool_of(&mut c)?;
        let free = if wait_first { None } else { pool.take(need) };
        let own = match free {
            Some(s) => s,
            None => {
                // Outside the lock: allocating page-locked memory waits for the device's
                // streams, which the worker may have to release meanwhile.
                drop(c);
                let slot = Slot::new(&dev, need)?;
                c = self.inner.calls.lock();
                let added = match pool_of(&mut c) {
                    Ok(pool) => pool.add(slot),
                    Err(e) => Err(Box::new((e, slot))),
                };
                match added {
                    Ok(i) => i,
                    Err(refused) => {
                        // Freed outside the lock, as it was allocated.
                        drop(c);
                        let (e, slot) = *refused;
                        drop(slot);
                        return Err(e);
                    }
                }
            }
        };
        pipe.set_own(own);
        let id = c.next_id();
        c.push(Entry::new(id, pipe, End::Request(None)));
        Ok(id)
    }

    /// How many of the communicator's device calls took the direct path so far (a test
    /// tool: the direct and the staged path give the same results).
    pub fn direct_calls(&self) -> u64 {
        self.direct_calls.load(Ordering::Relaxed)
    }

    /// Whether `comm`'s calls on `dev` go direct (`direct::decide`, once per device): what the
    /// direct calls share, or None. The first device call decides, even a stream-ordered one
    /// (`join`): the probe allocates device memory and a stream, which it must do before any
    /// stream of the device waits for this rank's calls.
    fn direct(&self, comm: &Comm, dev: &Device) -> Option<Arc<super::direct::Ctx>> {
        let mut d = self.direct.lock();
        if let Some((_, s)) = d.iter().find(|(o, _)| *o == dev.ordinal()) {
            return s.clone();
        }
        let s = super::direct::decide(comm, dev);
        d.push((dev.ordinal(), s.clone()));
        s
    }

    /// Makes the communicator's staging on `dev` now, where no device call has made it: for a
    /// caller that must never allocate page-locked memory later (`start_preallocated`).
    pub fn prepare_staging(&self, dev: &Device) -> Result<()> {
        self.prepare(dev, false, true, false)
    }

    /// `start` for a caller that must never allocate page-locked memory (NCCL's proxy thread,
    /// while NCCL's kernels run and wait for the call: an allocation would wait for them): the
    /// call waits for a free slot, as a stream-ordered call does, advancing the calls in
    /// flight meanwhile, until they have made no progress for the communicator's timeout. The
    /// staging must exist (`prepare_staging`).
    pub fn start_preallocated(&self, comm: &Arc<Comm>, call: DevCall) -> Result<u64> {
        let dev = call.device().clone();
        let mut pipe = Pipeline::new(comm, call, None, None)?;
        let (mut c, slots) = self.slots(comm, &dev, pipe.need(), 1)?;
        let Some(&own) = slots.first() else {
            return Err(Error::Internal("no staging slot was taken".into()));
        };
        pipe.set_own(own);
        let id = c.next_id();
        c.push(Entry::new(id, pipe, End::Request(None)));
        drop(c);
        self.background(comm)?;
        Ok(id)
    }

    /// Submits a stream-ordered call on the caller's stream `stream` and returns.
    ///
    /// # Safety
    /// `stream` is NULL, a reserved handle, or a live stream of the call's device that stays
    /// so until the call has ended; `call`'s buffers stay valid until then too.
    pub unsafe fn submit(
        &self,
        comm: &Arc<Comm>,
        call: DevCall,
        stream: *mut c_void,
    ) -> Result<()> {
        let dev = call.device().clone();
        // SAFETY: forwarded from this function's contract.
        let user: Stream = unsafe { dev.wrap_stream(stream) }?;
        let joined = {
            let c = self.inner.calls.lock();
            if let Some(e) = &c.error {
                return Err(earlier(e));
            }
            c.joined
        };
        if !joined {
            self.join(comm, &dev)?;
        }
        let direct = self.stream_direct(comm, &dev);
        self.log_stream_path(comm, &dev, direct.is_some());
        let mut pipe = Pipeline::new(comm, call, None, direct)?;
        let n = pipe.len();
        // Its events, made before the calls' lock is taken.
        let staged = (0..n)
            .map(|_| dev.create_event())
            .collect::<Result<Vec<_>>>()?;
        let passed = dev.create_event()?;
        let (mut c, slots) = self.slots(comm, &dev, pipe.need(), n)?;
        let Some(pool) = c.pool.as_mut() else {
            return Err(Error::Internal(
                "the stream-ordered calls' staging was not allocated".into(),
            ));
        };
        let enqueued = pipe.enqueue(pool, &user, slots, staged, passed);
        let id = c.next_id();
        let is_direct = pipe.is_direct();
        let entry = Entry::new(id, pipe, End::Stream { stream: Some(user) });
        if let Err(e) = enqueued {
            // Part of its schedule may be on the stream: released in order like any failure.
            let fin = c.push_failed(entry, e.clone());
            drop(c);
            finish(comm, fin);
            return Err(e);
        }
        if is_direct {
            self.direct_calls.fetch_add(1, Ordering::Relaxed);
        }
        c.push(entry);
        drop(c);
        // Where the worker cannot start, the call is failed so that its stream is released.
        if let Err(e) = self.background(comm) {
            let fin = self.inner.calls.lock().close(&e);
            finish(comm, fin);
            return Err(e);
        }
        Ok(())
    }

    /// Whether `comm`'s stream-ordered calls on `dev` go direct: only where
    /// `FABRICOLL_DEVICE_DIRECT=streams` asks for it and the communicator's calls go direct.
    /// While a direct call runs, the caller's stream waits on a flag and the call's device
    /// work runs on other streams, the provider's CUDA copies among them: where those run on
    /// the legacy default stream (libfabric's shm copies with cudaMemcpy) a caller's blocking
    /// stream deadlocks with them, and where streams outnumber the device's hardware queues
    /// one may sit behind the wait. The staged path keeps every copy on the caller's stream.
    /// The communicator's decision is made here all the same (`direct`: before any stream
    /// waits for this rank).
    fn stream_direct(&self, comm: &Comm, dev: &Device) -> Option<Arc<super::direct::Ctx>> {
        let direct = self.direct(comm, dev);
        direct.filter(|_| comm.device_direct == crate::config::DeviceDirect::Streams)
    }

    /// Logs once per communicator which path its stream-ordered calls take.
    fn log_stream_path(&self, comm: &Comm, dev: &Device, direct: bool) {
        if self.stream_logged.swap(true, Ordering::Relaxed) {
            return;
        }
        if direct {
            log::info!(
                "rank {}: stream-ordered calls on device {} go direct where their buffers are \
                 all device memory and they are uncompressed: the engine starts once the \
                 caller's stream has reached the call (an event), and the stream waits for a \
                 flag that the host writes once the output is complete; stream-ordered calls \
                 on page-locked host or managed memory, or compressed, are staged on the \
                 caller's stream",
                comm.rank,
                dev.ordinal()
            );
        } else {
            log::info!(
                "rank {}: stream-ordered calls on device {} are staged through page-locked \
                 host slots, copied on the caller's stream (direct stream-ordered calls: \
                 FABRICOLL_DEVICE_DIRECT=streams, where the communicator's device calls go \
                 direct and the callers' streams are non-blocking)",
                comm.rank,
                dev.ordinal()
            );
        }
    }

    /// Starts the worker if it is not running, and wakes it.
    fn background(&self, comm: &Arc<Comm>) -> Result<()> {
        let mut w = self.worker.lock();
        if w.is_none() {
            let inner = self.inner.clone();
            let comm = comm.clone();
            let t = std::thread::Builder::new()
                .name(format!("fabricoll-device-{}", comm.rank))
                .spawn(move || inner.work(&comm))
                .map_err(|e| Error::System(format!("cannot start the device worker: {e}")))?;
            *w = Some(t);
        }
        *self.inner.work.lock() = true;
        self.inner.wake.notify_all();
        Ok(())
    }

    /// Whether request `id` has ended (then it is gone, and its error returned).
    pub fn test(&self, comm: &Comm, id: u64) -> Result<bool> {
        let (r, fin) = {
            let mut c = self.inner.calls.lock();
            let (_, fin) = c.advance(comm);
            (c.take(id), fin)
        };
        finish(comm, fin);
        match r? {
            None => Ok(false),
            Some(r) => r.map(|()| true),
        }
    }

    /// Waits for request `id` (every call in flight fails after the communicator's timeout
    /// without progress) and frees it.
    pub fn wait(&self, comm: &Comm, id: u64) -> Result<()> {
        let mut nap = Duration::ZERO;
        loop {
            let (r, moved, fin) = {
                let mut c = self.inner.calls.lock();
                let (moved, fin) = c.advance(comm);
                (c.take(id), moved, fin)
            };
            finish(comm, fin);
            if let Some(r) = r? {
                return r;
            }
            nap = if moved {
                Duration::ZERO
            } else {
                crate::device::backoff_to(nap, MAX_NAP)
            };
        }
    }

    /// Hands request `id` over: `callback` runs once when it ends (in the worker, or here at
    /// once when it has ended).
    pub fn notify(&self, comm: &Arc<Comm>, id: u64, callback: Callback) -> Result<()> {
        let r = self.inner.calls.lock().set_callback(id, callback)?;
        match r {
            Ok(()) => self.background(comm),
            Err((cb, r)) => {
                finish(comm, vec![Finish::Callback(cb, r)]);
                Ok(())
            }
        }
    }

    /// Before a host call of `kind`: advances the device calls until none of its channel has
    /// slices left to start, so that the host call starts after them on every rank. Returns
    /// at once when no device call is in flight.
    pub fn settle(&self, comm: &Comm, kind: &Kind) -> Result<()> {
        let ch = Channel::of(kind);
        let mut nap = Duration::ZERO;
        loop {
            let (moved, fin) = {
                let mut c = self.inner.calls.lock();
                if !c.holds(ch) {
                    return Ok(());
                }
                c.advance(comm)
            };
            finish(comm, fin);
            nap = if moved {
                Duration::ZERO
            } else {
                crate::device::backoff_to(nap, MAX_NAP)
            };
        }
    }

    /// The first failure of a stream-ordered call on this communicator, if any.
    pub fn error(&self) -> Option<Error> {
        self.inner.calls.lock().error.clone()
    }

    /// Stops the worker, then ends every call still in flight (the communicator was aborted
    /// first, so at once), releasing their streams.
    pub fn shutdown(&self, comm: &Comm) {
        self.inner.shutdown.store(true, Ordering::SeqCst);
        self.inner.wake.notify_all();
        if let Some(t) = self.worker.lock().take() {
            if t.join().is_err() {
                log::error!("the device worker panicked");
            }
        }
        let fin = self.inner.calls.lock().close(&Error::InvalidUsage(
            "the communicator was destroyed while the call was in flight".into(),
        ));
        finish(comm, fin);
    }
}

impl Inner {
    /// The worker: advances the calls in flight until the communicator is destroyed; parks
    /// while none is.
    fn work(&self, comm: &Comm) {
        let mut nap = Duration::ZERO;
        while !self.shutdown.load(Ordering::SeqCst) {
            let (busy, moved, fin) = {
                let mut c = self.calls.lock();
                let (moved, fin) = c.advance(comm);
                (c.busy(), moved, fin)
            };
            finish(comm, fin);
            if !busy {
                let mut w = self.work.lock();
                if !*w && !self.shutdown.load(Ordering::SeqCst) {
                    self.wake.wait_for(&mut w, PARK);
                }
                *w = false;
                nap = Duration::ZERO;
            } else if moved {
                nap = Duration::ZERO;
            } else {
                nap = crate::device::backoff_to(nap, MAX_NAP);
            }
        }
    }
}

/// Runs the callbacks and drops the released streams, outside the calls' lock.
fn finish(comm: &Comm, fin: Vec<Finish>) {
    for f in fin {
        match f {
            Finish::Callback(cb, r) => crate::coll::notify::as_callback_of(comm, || cb(r)),
            Finish::Drop(s) => drop(s),
        }
    }
}
