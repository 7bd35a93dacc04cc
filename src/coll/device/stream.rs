//! Stream-ordered calls, and the staging every device call of a communicator shares.
//!
//! A stream-ordered call returns at once. On the caller's stream it enqueues a record of an
//! event (the host learns from it when the stream has reached the call) and a wait for the
//! communicator's flag to reach the call's sequence number (later work on the stream waits for
//! the call). The communicator's worker thread takes the calls in order: it waits for the
//! event, runs the call (the staged path), and writes the call's number to the flag, which
//! releases the stream. A call that fails releases the stream the same way; its error is kept
//! (`error`), and every later stream-ordered call on the communicator fails with it at once.
//! The worker starts at the first stream-ordered call and ends when the communicator is
//! destroyed (`shutdown`). docs/device-calls.md says why the stream waits on a flag.
use super::staged::Staging;
use super::DevCall;
use crate::algo::Collective;
use crate::coll::{Call, Comm, Kind};
use crate::device::{Device, Event, Flag, Stream};
use crate::error::{Error, Result};
use crate::reduce::{DataType, RedOp};
use crate::transport::Region;
use parking_lot::{Condvar, Mutex};
use std::os::raw::c_void;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A communicator's device state: its staging, and its stream-ordered calls.
#[derive(Default)]
pub struct Streams {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    /// Signalled when a stream-ordered call ends.
    ended: Condvar,
    staging: Mutex<Option<Staging>>,
}

#[derive(Default)]
struct State {
    worker: Option<Worker>,
    /// Calls submitted and not yet ended.
    pending: usize,
    /// The first failure of a stream-ordered call.
    error: Option<Error>,
    /// What the caller's streams wait for, and the number of the last call submitted.
    flag: Option<Flag>,
    seq: u32,
}

struct Worker {
    jobs: mpsc::Sender<Job>,
    thread: JoinHandle<()>,
}

/// One stream-ordered call, as the worker takes it.
struct Job {
    call: DevCall,
    /// Recorded on the caller's stream at the call.
    reached: Event,
    seq: u32,
    flag: Flag,
    /// The caller's stream, dropped once the flag is written: dropping it waits for its
    /// operations that hold memory (the flag wait), which the call itself releases.
    stream: Stream,
}

impl Streams {
    /// Runs a device call now, in the calling thread (a blocking call), after every
    /// stream-ordered call submitted before it.
    pub fn run(&self, comm: &Comm, call: &DevCall) -> Result<()> {
        self.drain(comm)?;
        // No stream-ordered call of this communicator is pending: a caller's stream waits for
        // none of its flags, so allocating here cannot deadlock on this communicator (its
        // peers reach the call only after preparing theirs, `prepare`).
        self.inner.prepare(call.device(), true)?;
        self.inner.run(comm, call)
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
        let prepared = {
            let st = self.inner.state.lock();
            if let Some(e) = &st.error {
                return Err(earlier(e));
            }
            // Set by `prepare`, after the staging: calls after the first never wait for the
            // staging's lock, which the worker holds while it runs a call.
            st.flag.is_some()
        };
        if !prepared && self.inner.prepare(&dev, false)? {
            // The first device use of the communicator allocated its page-locked memory. A
            // peer sharing this device (ranks as threads of one process) may still have to
            // allocate its own, and that waits for every stream of the device: so no rank's
            // stream waits for a flag before every rank has allocated.
            barrier(comm)?;
        }
        let mut st = self.inner.state.lock();
        if let Some(e) = &st.error {
            return Err(earlier(e));
        }
        let flag = st.flag.clone().ok_or_else(|| {
            Error::Internal("the stream-ordered calls' flag was not allocated".into())
        })?;
        let seq = st.seq.wrapping_add(1);
        let reached = dev.create_event()?;
        user.record(&reached)?;
        user.wait_flag(&flag, seq)?;
        st.seq = seq;
        st.pending += 1;
        if st.worker.is_none() {
            st.worker = Some(self.spawn(comm.clone(), dev)?);
        }
        let job = Job {
            call,
            reached,
            seq,
            flag: flag.clone(),
            stream: user,
        };
        let unsent = match &st.worker {
            Some(w) => w.jobs.send(job).err().map(|e| e.0),
            None => Some(job),
        };
        if let Some(job) = unsent {
            // The worker is gone, so every earlier call has ended: releasing is in order.
            flag.set(seq);
            st.pending -= 1;
            drop(st);
            drop(job);
            return Err(Error::Internal(
                "the communicator's stream worker has stopped".into(),
            ));
        }
        Ok(())
    }

    fn spawn(&self, comm: Arc<Comm>, dev: Device) -> Result<Worker> {
        let (tx, rx) = mpsc::channel::<Job>();
        let inner = self.inner.clone();
        let thread = std::thread::Builder::new()
            .name(format!("fabricoll-stream-{}", comm.rank))
            .spawn(move || inner.work(&comm, &dev, rx))
            .map_err(|e| Error::System(format!("cannot start the stream worker: {e}")))?;
        Ok(Worker { jobs: tx, thread })
    }

    /// The first failure of a stream-ordered call on this communicator, if any.
    pub fn error(&self) -> Option<Error> {
        self.inner.state.lock().error.clone()
    }

    /// Waits until every stream-ordered call submitted so far has ended (at most the
    /// communicator's timeout without one ending).
    pub fn drain(&self, comm: &Comm) -> Result<()> {
        let mut st = self.inner.state.lock();
        while st.pending > 0 {
            let before = st.pending;
            let r = self.inner.ended.wait_for(&mut st, comm.timeout.limit);
            if r.timed_out() && st.pending == before {
                return Err(Error::Timeout(format!(
                    "{before} stream-ordered call(s) of this communicator did not end within \
                     {} (their streams have not reached them, or a peer does not call)",
                    comm.timeout
                )));
            }
        }
        Ok(())
    }

    /// Stops the worker: the call it runs ends (the communicator was aborted first, so at
    /// once), the queued ones fail and release their streams.
    pub fn shutdown(&self) {
        let w = self.inner.state.lock().worker.take();
        if let Some(w) = w {
            drop(w.jobs);
            if w.thread.join().is_err() {
                log::error!("the stream worker panicked");
            }
        }
    }
}

impl Inner {
    /// Allocates the communicator's page-locked memory on its first device use (its staging
    /// slots and the stream-ordered calls' flag): whether it did. Never called while one of
    /// the communicator's stream-ordered calls is pending (allocating page-locked memory waits
    /// for every stream of the device, the caller's stream waiting for the flag included).
    /// `replace`: a blocking call may replace staging a failed call gave up, or of another
    /// device; a stream-ordered call fails instead (`run` in the worker allocates nothing).
    fn prepare(&self, dev: &Device, replace: bool) -> Result<bool> {
        let mut s = self.staging.lock();
        let fresh = match s.as_ref() {
            None => true,
            Some(st) if st.device().ordinal() != dev.ordinal() || !st.usable() => {
                if !replace {
                    return Err(Error::InvalidUsage(format!(
                        "this communicator's device memory staging is {} (a stream-ordered \
                         call allocates none); a blocking call on device {} renews it",
                        if st.usable() {
                            format!("on device {}", st.device().ordinal())
                        } else {
                            "given up after a failed call".into()
                        },
                        dev.ordinal()
                    )));
                }
                true
            }
            Some(_) => false,
        };
        if fresh {
            *s = Some(Staging::new(dev)?);
        }
        let mut st = self.state.lock();
        if st.flag.is_none() {
            st.flag = Some(dev.create_flag("fabricoll stream-ordered call done")?);
        }
        Ok(fresh)
    }

    /// Runs `call` on the staging `prepare` made; allocates no page-locked memory.
    fn run(&self, comm: &Comm, call: &DevCall) -> Result<()> {
        let mut s = self.staging.lock();
        match s.as_mut() {
            Some(st) if st.device().ordinal() == call.device().ordinal() => st.run(comm, call),
            _ => Err(Error::InvalidUsage(
                "this communicator's device staging is missing, on another device, or was \
                 given up after a failed call (a stream-ordered call allocates none; a blocking \
                 call renews it)"
                    .into(),
            )),
        }
    }

    /// The worker: runs the jobs in order until the sender is dropped.
    fn work(&self, comm: &Comm, dev: &Device, jobs: mpsc::Receiver<Job>) {
        let bound = dev.bind();
        loop {
            let job = match jobs.recv_timeout(Duration::from_secs(1)) {
                Ok(j) => j,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let earlier_error = self.state.lock().error.clone();
            let r = match (&bound, earlier_error) {
                (Err(e), _) => Err(e.clone()),
                (_, Some(e)) => Err(earlier(&e)),
                _ => self
                    .reached(comm, &job)
                    .and_then(|()| self.run(comm, &job.call)),
            };
            let mut st = self.state.lock();
            if let Err(e) = r {
                log::warn!("stream-ordered call {} failed: {e}", job.seq);
                st.error.get_or_insert(e);
            }
            // Release the caller's stream, in call order (one worker, calls taken in order).
            job.flag.set(job.seq);
            st.pending -= 1;
            self.ended.notify_all();
            drop(st);
            drop(job.stream);
        }
    }

    /// Waits until the caller's stream has reached the job's call (bounded by the
    /// communicator's timeout; an abort ends it).
    fn reached(&self, comm: &Comm, job: &Job) -> Result<()> {
        let start = Instant::now();
        let mut nap = Duration::from_micros(1);
        while !job.reached.query()? {
            comm.check_alive()?;
            if start.elapsed() > comm.timeout.limit {
                return Err(Error::Timeout(format!(
                    "the stream did not reach stream-ordered call {} within {}",
                    job.seq, comm.timeout
                )));
            }
            if nap < Duration::from_micros(20) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(nap);
            }
            nap = (nap * 2).min(Duration::from_micros(500));
        }
        Ok(())
    }
}

/// Every rank of `comm` has got here: a one-word host allreduce.
fn barrier(comm: &Comm) -> Result<()> {
    let word = Box::into_raw(Box::new([0u8; 4]));
    // SAFETY: `word` is leaked unless the call succeeded, so it outlives every use.
    let region = unsafe { Region::from_raw(word.cast(), 4) };
    let call = Call {
        kind: Kind::Coll(Collective::AllReduce),
        send: region,
        recv: region,
        count: 1,
        dtype: DataType::Uint32,
        op: RedOp::Sum,
        root: 0,
        algo: None,
    };
    comm.run(&call)?;
    // SAFETY: from `Box::into_raw` above; the call has completed, nothing uses it any more.
    drop(unsafe { Box::from_raw(word) });
    Ok(())
}

/// The error of a call refused because an earlier stream-ordered call failed.
fn earlier(e: &Error) -> Error {
    let text = format!("an earlier stream-ordered call on this communicator failed: {e}");
    match e {
        Error::InvalidArgument(_) | Error::InvalidUsage(_) => Error::InvalidUsage(text),
        Error::System(_) => Error::System(text),
        Error::Internal(_) => Error::Internal(text),
        Error::Remote(_) => Error::Remote(text),
        Error::Timeout(_) => Error::Timeout(text),
    }
}
