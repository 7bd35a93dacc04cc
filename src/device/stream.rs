//! `Stream`: an ordered queue of device work (copies, kernels, event records, flag waits and
//! writes), created by this library or wrapped from a caller's handle.
//!
//! A stream keeps what its pending operations use: the spans' allocations (so a buffer dropped
//! meanwhile is freed only after the work), and the flags it waits for (so a wait that does not
//! end names them). After each operation that uses memory it records one of its own events, and
//! lets go of an operation's holdings once that event has completed: on each later operation,
//! `query`, `synchronize`, or `Event::query` of an event recorded on it.
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::backend::{Kernel, PtrKind, RawEvent, RawStream};
use super::flag::Flag;
use super::memory::{Alloc, Span};
use super::Device;
use crate::config::Timeout;
use crate::reduce::{DataType, RedOp};
use crate::{Error, Result};

/// Handle values CUDA reserves: the legacy default stream and the per-thread default stream.
pub const LEGACY_STREAM: usize = 0;
/// `CU_STREAM_LEGACY`.
pub const CU_STREAM_LEGACY: usize = 1;
/// `CU_STREAM_PER_THREAD`.
pub const CU_STREAM_PER_THREAD: usize = 2;

/// A stream of one device. Operations take `&self` and may come from any thread that has the
/// device's context current (`Device::bind`).
pub struct Stream {
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) dev: Device,
    pub(crate) raw: RawStream,
    /// Created here (destroyed on Drop) or a caller's (left alone).
    owned: bool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Operations not yet seen complete, oldest first: the event recorded after each, and what
    /// it holds alive.
    inflight: VecDeque<(RawEvent, Vec<Arc<Alloc>>)>,
    /// Events free for reuse.
    pool: Vec<RawEvent>,
    /// Flag waits enqueued and not yet seen satisfied, oldest first.
    waits: VecDeque<(Flag, u32)>,
}

impl Stream {
    pub(crate) fn create(dev: &Device) -> Result<Stream> {
        dev.check_current()?;
        let raw = dev.backend().stream_create()?;
        Ok(Stream::from_raw(dev, raw, true))
    }

    /// # Safety
    /// As `Device::wrap_stream`.
    pub(crate) unsafe fn wrap(dev: &Device, handle: *mut c_void) -> Result<Stream> {
        let what = match handle as usize {
            LEGACY_STREAM => Some("the legacy default stream (NULL)"),
            CU_STREAM_LEGACY => Some("the legacy default stream (CU_STREAM_LEGACY)"),
            CU_STREAM_PER_THREAD => Some("the per-thread default stream (CU_STREAM_PER_THREAD)"),
            _ => None,
        };
        if let Some(what) = what {
            return Err(Error::arg(
                "stream",
                format!(
                    "{what} is refused: it synchronises with other streams behind the caller's \
                     back; pass a stream created with cudaStreamCreate (or \
                     cudaStreamNonBlocking)"
                ),
            ));
        }
        dev.check_current()?;
        // SAFETY: the caller promises a live stream of this device for the result's lifetime.
        let raw = unsafe { dev.backend().stream_adopt(handle as u64) }?;
        Ok(Stream::from_raw(dev, raw, false))
    }

    fn from_raw(dev: &Device, raw: RawStream, owned: bool) -> Stream {
        Stream {
            shared: Arc::new(Shared {
                dev: dev.clone(),
                raw,
                owned,
                state: Mutex::new(State::default()),
            }),
        }
    }

    pub fn device(&self) -> &Device {
        &self.shared.dev
    }

    /// The backend's handle: a `CUstream` on CUDA, to pass to other CUDA code.
    pub fn handle(&self) -> *mut c_void {
        self.shared.raw.0 as *mut c_void
    }

    /// Whether this stream was created here (and is destroyed on Drop).
    pub fn is_owned(&self) -> bool {
        self.shared.owned
    }

    /// Enqueues a copy of `src` to `dst` (same length; device, managed or page-locked host
    /// memory each). Returns at once: the copy happens in stream order.
    pub fn copy(&self, dst: &Span, src: &Span) -> Result<()> {
        same_len("dst", dst, src.len())?;
        self.enqueue(&[dst, src], |b, s| {
            // SAFETY: both spans are stream-usable memory (spans are only made so) held alive
            // until the copy completes (enqueue keeps their allocations, raw spans are the
            // caller's promise).
            unsafe { b.copy(s, dst.addr(), src.addr(), dst.len()) }
        })
    }

    /// `dst[i] = dst[i] ⊕ src[i]` on the device, for `dt` and `op` (Avg reduces as Sum; see
    /// `scale_avg`). The spans hold whole elements of `dt` and have the same length.
    pub fn reduce(&self, dt: DataType, op: RedOp, dst: &Span, src: &Span) -> Result<()> {
        self.reduce2(dt, op, dst, dst, src)
    }

    /// `dst[i] = a[i] ⊕ b[i]` on the device (`dst` may be `a`).
    pub fn reduce2(&self, dt: DataType, op: RedOp, dst: &Span, a: &Span, b: &Span) -> Result<()> {
        if !op.supports(dt) {
            return Err(Error::arg(
                "op",
                format!("{op} is a bitwise op, for integer types only, not {dt}"),
            ));
        }
        whole(dt, "dst", dst)?;
        whole(dt, "a", a)?;
        whole(dt, "b", b)?;
        same_len("a", a, dst.len())?;
        same_len("b", b, dst.len())?;
        let k = Kernel::Reduce {
            dtype: dt,
            op,
            dst: dst.addr(),
            a: a.addr(),
            b: b.addr(),
            count: dst.len() / dt.size(),
        };
        self.launch(&[dst, a, b], k)
    }

    /// `dst[i] = dst[i] / n` on the device: Avg's last step (`reduce::scale_avg`'s semantics).
    pub fn scale_avg(&self, dt: DataType, dst: &Span, n: usize) -> Result<()> {
        if n == 0 {
            return Err(Error::arg("n", "the Avg divisor must be at least 1"));
        }
        whole(dt, "dst", dst)?;
        let k = Kernel::ScaleAvg {
            dtype: dt,
            dst: dst.addr(),
            count: dst.len() / dt.size(),
            n,
        };
        self.launch(&[dst], k)
    }

    fn launch(&self, spans: &[&Span], k: Kernel) -> Result<()> {
        if spans[0].is_empty() {
            self.shared.dev.check_current()?;
            return Ok(());
        }
        // SAFETY: the spans are stream-usable memory held alive until the kernel completes.
        self.enqueue(spans, |b, s| unsafe { b.launch(s, &k) })
    }

    /// Copies host bytes `src` (pageable memory) to `dst`, and returns when they are there:
    /// a copy from pageable memory is synchronous, so this stages through page-locked memory
    /// and waits, at most `timeout`, for the stream to finish the copy.
    pub fn upload(&self, dst: &Span, src: &[u8], timeout: impl Into<Timeout>) -> Result<()> {
        same_len("src", dst, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let mut stage = self.shared.dev.alloc_host(src.len())?;
        stage.as_mut_slice()?.copy_from_slice(src);
        self.copy(dst, &stage.span())?;
        self.synchronize(timeout)
    }

    /// Copies `src` to host bytes `dst` (pageable memory), and returns when they are there
    /// (staged through page-locked memory; waits at most `timeout` for the stream).
    pub fn download(&self, dst: &mut [u8], src: &Span, timeout: impl Into<Timeout>) -> Result<()> {
        same_len("dst", src, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        let mut stage = self.shared.dev.alloc_host(dst.len())?;
        self.copy(&stage.span(), src)?;
        self.synchronize(timeout)?;
        dst.copy_from_slice(stage.as_mut_slice()?);
        Ok(())
    }

    /// Makes later work on this stream wait until `flag` reaches `value` (written by the host
    /// with `Flag::set`, or by another stream). See `flag` for the comparison.
    pub fn wait_flag(&self, flag: &Flag, value: u32) -> Result<()> {
        let span = flag.span();
        self.enqueue(&[&span], |b, s| {
            // SAFETY: the flag's word is page-locked memory held alive by the span until the
            // wait completes.
            unsafe { b.stream_wait_value(s, span.addr(), value, flag.name()) }
        })?;
        self.lock().waits.push_back((flag.clone(), value));
        Ok(())
    }

    /// Writes `value` to `flag` when the stream reaches this point (after the work before it).
    pub fn write_flag(&self, flag: &Flag, value: u32) -> Result<()> {
        let span = flag.span();
        self.enqueue(&[&span], |b, s| {
            // SAFETY: as in wait_flag.
            unsafe { b.stream_write_value(s, span.addr(), value) }
        })
    }

    /// Records `ev` here: it completes when the work enqueued so far has.
    pub fn record(&self, ev: &super::Event) -> Result<()> {
        ev.record_on(self)
    }

    /// Makes later work on this stream wait for `ev`'s last record (an event never recorded
    /// is an error, where CUDA would not wait at all).
    pub fn wait_event(&self, ev: &super::Event) -> Result<()> {
        let raw = ev.recorded_raw("ev")?;
        ev.same_device(&self.shared.dev)?;
        self.shared.dev.check_current()?;
        // SAFETY: both handles are live (the event and this stream are held by the caller).
        unsafe {
            self.shared
                .dev
                .backend()
                .stream_wait_event(self.shared.raw, raw)
        }
    }

    /// Whether all work enqueued so far has completed (an emulated stream whose flag wait timed
    /// out reports that error).
    pub fn query(&self) -> Result<bool> {
        self.shared.dev.check_current()?;
        let mut st = self.lock();
        self.shared.reap(&mut st)?;
        // SAFETY: the stream is live while self is.
        unsafe { self.shared.dev.backend().stream_query(self.shared.raw) }
    }

    /// Waits until all work enqueued so far has completed, at most `timeout`; past it, a
    /// `Timeout` error that names the flags the stream still waits for.
    pub fn synchronize(&self, timeout: impl Into<Timeout>) -> Result<()> {
        let timeout = timeout.into();
        let start = Instant::now();
        let mut nap = Duration::from_micros(1);
        loop {
            if self.query()? {
                let mut st = self.lock();
                return self.shared.reap(&mut st);
            }
            if start.elapsed() >= timeout.limit {
                return Err(Error::Timeout(format!(
                    "stream did not finish within {timeout}: {}",
                    self.shared.pending_why()
                )));
            }
            nap = backoff(nap);
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.lock()
    }

    /// Checks the context and the spans' kinds, runs `op` and keeps the spans' allocations
    /// until an event recorded after it completes.
    fn enqueue(
        &self,
        spans: &[&Span],
        op: impl FnOnce(&dyn super::Backend, RawStream) -> Result<()>,
    ) -> Result<()> {
        let dev = &self.shared.dev;
        dev.check_current()?;
        for s in spans {
            if !s.kind().stream_usable() {
                return Err(Error::arg(
                    "span",
                    format!("{s:?} is not memory a stream can use"),
                ));
            }
            if let PtrKind::Device { ordinal } = s.kind() {
                if ordinal != dev.ordinal() {
                    return Err(Error::arg(
                        "span",
                        format!(
                            "{s:?} is memory of device {ordinal}, not of this stream's device {}",
                            dev.ordinal()
                        ),
                    ));
                }
            }
        }
        let mut st = self.lock();
        self.shared.reap(&mut st)?;
        let holds: Vec<Arc<Alloc>> = spans.iter().filter_map(|s| s.owner()).collect();
        if holds.is_empty() {
            return op(dev.backend(), self.shared.raw);
        }
        // The event that guards the holdings exists before the operation is enqueued.
        let ev = match st.pool.pop() {
            Some(e) => e,
            None => dev.backend().event_create()?,
        };
        if let Err(e) = op(dev.backend(), self.shared.raw) {
            st.pool.push(ev);
            return Err(e);
        }
        // SAFETY: the event and the stream are live.
        if let Err(e) = unsafe { dev.backend().event_record(ev, self.shared.raw) } {
            // The operation is enqueued but unguarded: keep its memory for good rather than
            // risk freeing it under the device.
            std::mem::forget(holds);
            st.pool.push(ev);
            return Err(e);
        }
        st.inflight.push_back((ev, holds));
        Ok(())
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets go of the holdings of operations seen complete, and of flag waits satisfied.
    fn reap(&self, st: &mut State) -> Result<()> {
        while let Some((ev, _)) = st.inflight.front() {
            // SAFETY: the event is live (owned by this stream's state).
            if !unsafe { self.dev.backend().event_query(*ev) }? {
                break;
            }
            let (ev, holds) = st.inflight.pop_front().expect("front exists");
            st.pool.push(ev);
            drop(holds);
        }
        while st.waits.front().is_some_and(|(f, v)| f.reached(*v)) {
            st.waits.pop_front();
        }
        Ok(())
    }

    /// What the stream is still waiting for, for a timeout's message.
    pub(crate) fn pending_why(&self) -> String {
        let st = self.lock();
        let waits: Vec<String> = st
            .waits
            .iter()
            .filter(|(f, v)| !f.reached(*v))
            .map(|(f, v)| format!("flag '{}' to reach {v} (it holds {})", f.name(), f.get()))
            .collect();
        if waits.is_empty() {
            "its work is still running (no flag wait is pending)".into()
        } else {
            format!("it waits for {}", waits.join(", "))
        }
    }

    /// Reaps once, for `Event::query`.
    pub(crate) fn reap_now(&self) {
        let mut st = self.lock();
        let _ = self.reap(&mut st);
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let limit = crate::config::get()
            .map(|c| c.timeout_setting())
            .unwrap_or_else(|_| Duration::from_secs(600).into());
        let start = Instant::now();
        let mut nap = Duration::from_micros(1);
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let b = self.dev.backend();
        while let Some((ev, holds)) = st.inflight.pop_front() {
            // Wait for the work that uses held memory: freeing it earlier would free it under
            // the device. Past the deadline, keep the memory for good (a leak, never a fault).
            // SAFETY: the event is live until destroyed below. (A failed query means the stream
            // failed: its work will not run, so the memory may go.)
            while !unsafe { b.event_query(ev) }.unwrap_or(true) {
                if start.elapsed() >= limit.limit {
                    log::error!(
                        "device stream dropped with work pending past {limit}: its buffers are \
                         leaked, not freed under the device"
                    );
                    std::mem::forget(holds);
                    // Leave the event alone too: it may still be recorded on pending work.
                    st.inflight.clear();
                    return;
                }
                nap = backoff(nap);
            }
            drop(holds);
            st.pool.push(ev);
        }
        for ev in st.pool.drain(..) {
            // SAFETY: the event is this stream's and complete; destroyed once.
            unsafe { b.event_destroy(ev) };
        }
        if self.owned {
            // SAFETY: created by stream_create, destroyed once, and no Stream refers to it.
            unsafe { b.stream_destroy(self.raw) };
        }
    }
}

/// The next nap of a polling wait: yield while short, then sleep, doubling up to `MAX_NAP`.
pub(crate) fn backoff(nap: Duration) -> Duration {
    backoff_to(nap, MAX_NAP)
}

/// `backoff` with its own longest sleep `max` (the staging pipeline wakes more often).
pub(crate) fn backoff_to(nap: Duration, max: Duration) -> Duration {
    if nap < Duration::from_micros(50) {
        std::thread::yield_now();
    } else {
        std::thread::sleep(nap);
    }
    (nap * 2).max(Duration::from_micros(1)).min(max)
}

/// The longest sleep of a polling wait.
const MAX_NAP: Duration = Duration::from_millis(1);

fn same_len(arg: &str, s: &Span, expected: usize) -> Result<()> {
    if s.len() != expected {
        return Err(Error::arg(
            arg,
            format!(
                "{} bytes, expected {expected} (the other operand's length)",
                s.len()
            ),
        ));
    }
    Ok(())
}

/// A kernel operand: whole elements of `dt`, at an address aligned to the element size (the
/// device faults on misaligned loads).
fn whole(dt: DataType, arg: &str, s: &Span) -> Result<()> {
    if !s.addr().is_multiple_of(dt.size() as u64) {
        return Err(Error::arg(
            arg,
            format!(
                "address {:#x} is not aligned to {} bytes (the size of {dt})",
                s.addr(),
                dt.size()
            ),
        ));
    }
    if !s.len().is_multiple_of(dt.size()) {
        return Err(Error::arg(
            arg,
            format!("{} bytes is not a whole number of {dt} elements", s.len()),
        ));
    }
    Ok(())
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let own = if self.shared.owned {
            "owned"
        } else {
            "borrowed"
        };
        write!(f, "Stream({:#x}, {own})", self.shared.raw.0)
    }
}
