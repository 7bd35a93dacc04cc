//! The emulated device's engine: each stream is a worker thread that runs its operations in
//! order, after a random delay each (so that a missing wait shows up as a wrong result or a
//! fault, not as luck), and events and flags complete when the worker gets to them, truly
//! asynchronously to the host. Copies and kernels reach device memory only through the
//! engine's alias (`memory::Mem::translate`). An operation that fails (a fault, a flag wait
//! past its deadline) makes the stream's error sticky, as a CUDA error is: later operations
//! are skipped, events recorded after it report it. Each stream runs on one of its context's
//! hardware queues (`queue`): an operation waits, before it starts, for every operation
//! enqueued earlier on that queue by any stream to have started, and a wait starts only once
//! it is satisfied.
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::memory::Mem;
use super::queue::HwQueue;
use crate::device::backend::Kernel;
use crate::device::flag::reached;
use crate::device::stream::backoff;
use crate::{Error, Result};

/// An event: generations recorded and completed.
#[derive(Default)]
pub(super) struct EventState {
    inner: Mutex<EventInner>,
    cv: Condvar,
}

#[derive(Default)]
struct EventInner {
    recorded: u64,
    done: u64,
    error: Option<Error>,
}

impl EventState {
    fn lock(&self) -> MutexGuard<'_, EventInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new record: the generation the worker completes.
    pub(super) fn record(&self) -> u64 {
        let mut g = self.lock();
        g.recorded += 1;
        g.recorded
    }

    fn complete(&self, gen: u64, error: Option<Error>) {
        let mut g = self.lock();
        g.done = g.done.max(gen);
        if gen == g.recorded {
            g.error = error;
        }
        self.cv.notify_all();
    }

    /// Whether the last record has completed (its stream's error, if it failed).
    pub(super) fn query(&self) -> Result<bool> {
        let g = self.lock();
        match &g.error {
            Some(e) if g.done >= g.recorded => Err(e.clone()),
            _ => Ok(g.done >= g.recorded),
        }
    }

    /// The generation a wait issued now waits for.
    pub(super) fn target(&self) -> u64 {
        self.lock().recorded
    }

    fn wait_gen(&self, gen: u64, deadline: Instant) -> bool {
        let left = deadline.saturating_duration_since(Instant::now());
        let (g, _) = self
            .cv
            .wait_timeout_while(self.lock(), left, |g| g.done < gen)
            .unwrap_or_else(|p| p.into_inner());
        g.done >= gen
    }
}

/// One stream operation.
pub(super) enum Op {
    Copy { dst: u64, src: u64, len: usize },
    Kernel(Kernel),
    Record(Arc<EventState>, u64),
    WaitEvent(Arc<EventState>, u64),
    WaitValue { addr: u64, value: u32, name: String },
    WriteValue { addr: u64, value: u32 },
}

impl Op {
    /// Whether the operation is a wait, which starts (and lets its hardware queue go on) only
    /// once satisfied.
    fn waits(&self) -> bool {
        matches!(self, Op::WaitValue { .. } | Op::WaitEvent(..))
    }
}

/// The worker's queue and progress.
pub(super) struct Worker {
    q: Mutex<Queue>,
    cv: Condvar,
    /// The hardware queue the stream runs on.
    hw: Arc<HwQueue>,
}

#[derive(Default)]
struct Queue {
    /// Operations with their tickets of the hardware queue.
    ops: VecDeque<(u64, Op)>,
    enqueued: u64,
    done: u64,
    error: Option<Error>,
    exit: bool,
}

/// The engine's settings, shared by the streams of a device.
#[derive(Clone)]
pub(super) struct Engine {
    pub(super) mem: Arc<Mutex<Mem>>,
    pub(super) max_delay: Duration,
    pub(super) flag_timeout: Duration,
}

impl Worker {
    /// A stream: a worker thread over `engine` on hardware queue `hw`, its delays drawn from
    /// `seed`.
    pub(super) fn spawn(
        engine: Engine,
        hw: Arc<HwQueue>,
        seed: u64,
        name: String,
    ) -> Result<Arc<Worker>> {
        let w = Arc::new(Worker {
            q: Mutex::new(Queue::default()),
            cv: Condvar::new(),
            hw,
        });
        let me = w.clone();
        std::thread::Builder::new()
            .name(name)
            .spawn(move || me.run(engine, seed))
            .map_err(|e| Error::System(format!("emulated device: stream thread: {e}")))?;
        Ok(w)
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.q.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn push(&self, op: Op) {
        let mut q = self.lock();
        // Under the stream's lock: its tickets follow its order.
        let ticket = self.hw.ticket();
        q.ops.push_back((ticket, op));
        q.enqueued += 1;
        self.cv.notify_all();
    }

    /// Whether everything enqueued has run; the sticky error if one failed.
    pub(super) fn query(&self) -> Result<bool> {
        let q = self.lock();
        match &q.error {
            Some(e) => Err(e.clone()),
            None => Ok(q.done == q.enqueued),
        }
    }

    /// Whether everything enqueued has run (or been skipped after a failure).
    pub(super) fn idle(&self) -> bool {
        let q = self.lock();
        q.done == q.enqueued
    }

    /// Ends the thread once the queue is drained.
    pub(super) fn exit(&self) {
        self.lock().exit = true;
        self.cv.notify_all();
    }

    fn run(&self, engine: Engine, seed: u64) {
        let mut rng = seed | 1;
        loop {
            let (ticket, op) = {
                let mut q = self.lock();
                loop {
                    if let Some(op) = q.ops.pop_front() {
                        break op;
                    }
                    if q.exit {
                        return;
                    }
                    q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            let failed = self.lock().error.clone();
            if failed.is_none() && !engine.max_delay.is_zero() {
                // xorshift64: a delay in [0, max_delay].
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let ns = engine.max_delay.as_nanos() as u64;
                std::thread::sleep(Duration::from_nanos(rng % (ns + 1)));
            }
            // A skipped operation takes no turn. Past the deadline (an earlier wait on the
            // queue that never ends, where a GPU would hang), the stream fails, naming why.
            let turn = match failed {
                Some(_) => Ok(()),
                None => self.turn(ticket, engine.flag_timeout),
            };
            let waits = op.waits() && failed.is_none() && turn.is_ok();
            if !waits {
                self.hw.start(ticket);
            }
            let result = match (failed.or(turn.err()), op) {
                (failed, Op::Record(ev, gen)) => {
                    ev.complete(gen, failed.clone());
                    failed.map_or(Ok(()), Err)
                }
                (Some(e), _) => Err(e),
                (None, op) => run_op(&engine, op),
            };
            if waits {
                self.hw.start(ticket);
            }
            let mut q = self.lock();
            if let Err(e) = result {
                if q.error.is_none() {
                    log::warn!("emulated stream failed: {e}");
                    q.error = Some(e);
                }
            }
            q.done += 1;
        }
    }

    /// Waits until every operation enqueued before `ticket` on the stream's hardware queue
    /// has started, at most `limit`.
    fn turn(&self, ticket: u64, limit: Duration) -> Result<()> {
        if self.hw.wait_turn(ticket, limit) {
            return Ok(());
        }
        Err(Error::Timeout(format!(
            "emulated stream: an operation enqueued earlier on its hardware queue {} (by another \
             stream of the context sharing the queue) did not start within {} ms: a wait at the \
             head of a queue holds back every stream behind it",
            self.hw.index(),
            limit.as_millis()
        )))
    }
}

fn run_op(engine: &Engine, op: Op) -> Result<()> {
    match op {
        Op::Copy { dst, src, len } => {
            let mem = engine.mem.lock().unwrap_or_else(|p| p.into_inner());
            let d = mem.translate(dst, len, "copy destination")?;
            let s = mem.translate(src, len, "copy source")?;
            // SAFETY: both ranges lie in live mappings the engine may access (translate
            // checked them), held alive by the stream's owner; copy allows overlap.
            unsafe { std::ptr::copy(s, d, len) };
            Ok(())
        }
        Op::Kernel(k) => kernel(engine, &k),
        Op::Record(..) => unreachable!("handled by the worker"),
        Op::WaitEvent(ev, gen) => {
            if ev.wait_gen(gen, Instant::now() + engine.flag_timeout) {
                Ok(())
            } else {
                Err(Error::Timeout(format!(
                    "emulated stream: an event it waits for did not complete within {} ms",
                    engine.flag_timeout.as_millis()
                )))
            }
        }
        Op::WaitValue { addr, value, name } => {
            let word = flag_word(engine, addr, &name)?;
            let start = Instant::now();
            let mut nap = Duration::from_micros(1);
            while !reached(word.load(Ordering::Acquire), value) {
                if start.elapsed() >= engine.flag_timeout {
                    return Err(Error::Timeout(format!(
                        "emulated stream: flag '{name}' did not reach {value} within {} ms: it \
                         holds {} (nobody wrote it?)",
                        engine.flag_timeout.as_millis(),
                        word.load(Ordering::Acquire)
                    )));
                }
                nap = backoff(nap);
            }
            Ok(())
        }
        Op::WriteValue { addr, value } => {
            flag_word(engine, addr, "written")?.store(value, Ordering::Release);
            Ok(())
        }
    }
}

fn flag_word<'a>(engine: &Engine, addr: u64, name: &str) -> Result<&'a AtomicU32> {
    let mem = engine.mem.lock().unwrap_or_else(|p| p.into_inner());
    let p = mem.translate(addr, 4, &format!("flag '{name}'"))?;
    if !(p as usize).is_multiple_of(4) {
        return Err(Error::arg(
            "flag",
            format!("{addr:#x} is not 4-byte aligned"),
        ));
    }
    // SAFETY: 4 aligned bytes of page-locked memory, held alive by the stream until the
    // operation completes; every access to the word is atomic.
    Ok(unsafe { AtomicU32::from_ptr(p.cast()) })
}

/// A kernel on the host reducers, through the engine's alias.
fn kernel(engine: &Engine, k: &Kernel) -> Result<()> {
    let mem = engine.mem.lock().unwrap_or_else(|p| p.into_inner());
    match *k {
        Kernel::Reduce {
            dtype,
            op,
            dst,
            a,
            b,
            count,
        } => {
            let len = count * dtype.size();
            let overlap = |x: u64, y: u64| x != y && x < y + len as u64 && y < x + len as u64;
            if overlap(dst, a) || overlap(dst, b) {
                return Err(Error::arg(
                    "dst",
                    "a kernel's destination overlaps an operand other than exactly",
                ));
            }
            let d = mem.translate(dst, len, "kernel dst")?;
            let pa = mem.translate(a, len, "kernel operand a")?;
            let pb = mem.translate(b, len, "kernel operand b")?;
            drop(mem);
            // SAFETY: the three ranges lie in live engine-accessible mappings (translated
            // above) held alive by the stream's owner; `dst` is either disjoint from an operand
            // or equal to it (checked), and the equal case goes through reduce_inplace so no
            // slice aliases a mutable one.
            unsafe {
                let dslice = std::slice::from_raw_parts_mut(d, len);
                if dst == a && dst == b {
                    let copy = dslice.to_vec();
                    crate::reduce::reduce_inplace(dtype, op, dslice, &copy)?;
                } else if dst == a {
                    crate::reduce::reduce_inplace(
                        dtype,
                        op,
                        dslice,
                        std::slice::from_raw_parts(pb, len),
                    )?;
                } else if dst == b {
                    // Every op is exactly commutative (reduce's documentation).
                    crate::reduce::reduce_inplace(
                        dtype,
                        op,
                        dslice,
                        std::slice::from_raw_parts(pa, len),
                    )?;
                } else {
                    crate::reduce::reduce(
                        dtype,
                        op,
                        std::slice::from_raw_parts(pa, len),
                        std::slice::from_raw_parts(pb, len),
                        dslice,
                    )?;
                }
            }
            Ok(())
        }
        Kernel::ScaleAvg {
            dtype,
            dst,
            count,
            n,
        } => {
            let len = count * dtype.size();
            let d = mem.translate(dst, len, "kernel dst")?;
            drop(mem);
            // SAFETY: as above, one range.
            let dslice = unsafe { std::slice::from_raw_parts_mut(d, len) };
            crate::reduce::scale_avg(dtype, dslice, n)?;
            Ok(())
        }
    }
}
