//! The direct path of a device call: where the communicator's transport registers device
//! memory (FI_HMEM, and a real registration of it worked: `decide`, once per communicator and
//! device), a call on device buffers runs as one host-engine call on the caller's buffers
//! themselves (`Direct`): the transport sends from and receives into their registrations, and
//! what the executor does with bytes runs on the device (`DevMem`): copies, reductions with the
//! seam's kernels (the host reducers' bits) and Avg's division, the host waiting for each to the
//! communicator's deadline; a schedule's Tmp memory and its receive-and-reduce staging are
//! device memory, registered too. The host never touches the bytes. An in-place call's input is
//! first copied aside on the device, so that no step writes over what another still reads.
//! With `FABRICOLL_DEVICE_DIRECT=streams` a stream-ordered call goes direct too (by default it
//! is staged, `stream::Streams::stream_direct` says why): its host-engine call starts once the caller's stream
//! has reached it (an event), and the stream waits for a flag written once it has finished
//! (`staged::Pipeline::enqueue`, with no copies). Every other call is staged (`staged`);
//! docs/device-calls.md says which.
//!
//! Ranks must decide alike for a collective (one call direct, sliced calls staged): they do
//! where their transports are alike, and otherwise the calls' signatures differ, which the
//! engine reports as calls that differ rather than hanging.
use super::slices::{Blocks, Slice};
use super::DevCall;
use crate::algo::varied::Varied;
use crate::coll::{Comm, Kind, RequestId};
use crate::config::{Compression, DeviceDirect, Timeout};
use crate::device::{Device, DeviceBuffer, PtrKind, Span, Stream};
use crate::error::{Error, Result};
use crate::exec::DeviceMem;
use crate::reduce::{DataType, RedOp};
use crate::transport::{Mr, Region, Transport};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// Bytes of device memory the probe registers.
const PROBE_BYTES: usize = 4096;

/// Most spare device buffers a communicator keeps for its direct calls (`Ctx`).
const SPARES: usize = 8;

/// What a communicator's direct calls on one device share: the copy stream, and device buffers
/// registered with the transport for their scratch (Tmp and receive-and-reduce staging) and an
/// in-place input's copy aside, kept between calls. A call takes them and gives them back;
/// they are freed with the communicator (up to `SPARES` of them): freeing device memory waits
/// for every stream of the device on CUDA, which a call must not do while a peer's stream may
/// wait for it (the staging slots are kept for the same reason, docs/device-calls.md).
pub(super) struct Ctx {
    stream: Stream,
    spare: Mutex<Vec<Held>>,
}

/// A device buffer and its registration. The registration is declared first so that it is
/// dropped (deregistered) before the memory under it is freed.
struct Held {
    mr: Mr,
    buf: DeviceBuffer,
}

impl Ctx {
    /// A registered device buffer of at least `len` bytes: a spare one, else a new one.
    fn take(&self, t: &dyn Transport, dev: &Device, len: usize) -> Result<Held> {
        let mut spare = self.spare.lock();
        if let Some(i) = spare.iter().position(|h| h.buf.len() >= len) {
            return Ok(spare.swap_remove(i));
        }
        drop(spare);
        dev.make_current()?;
        let buf = dev.alloc(len)?;
        // SAFETY: device memory of `buf.len()` bytes, held with its registration in `Held`.
        let r = unsafe { Region::from_raw(buf.addr() as *mut u8, buf.len()) };
        let mr = t.register_device(r, dev.ordinal())?;
        Ok(Held { buf, mr })
    }

    /// Gives `h` back for later calls (beyond `SPARES`, the smallest goes).
    fn give(&self, h: Held) {
        let mut spare = self.spare.lock();
        spare.push(h);
        if spare.len() > SPARES {
            if let Some(i) = (0..spare.len()).min_by_key(|&i| spare[i].buf.len()) {
                spare.swap_remove(i);
            }
        }
    }
}

/// Whether `comm`'s device calls on `dev` go direct: what they share where they do (None:
/// staged). Logged once, at info, with the reason.
pub(super) fn decide(comm: &Comm, dev: &Device) -> Option<Arc<Ctx>> {
    let provider = &comm.transport().caps().provider;
    let why = probe(comm, dev);
    match why {
        Ok(s) => {
            log::info!(
                "rank {}: device calls on device {} go direct: provider {provider} registers \
                 device memory (FI_HMEM), so calls on device buffers alone need no host copy \
                 (reductions run on the device), stream-ordered ones with \
                 FABRICOLL_DEVICE_DIRECT=streams; compressed and mixed host and device calls \
                 are staged through page-locked host memory",
                comm.rank,
                dev.ordinal()
            );
            Some(Arc::new(Ctx {
                stream: s,
                spare: Mutex::new(Vec::new()),
            }))
        }
        Err(reason) => {
            log::info!(
                "rank {}: device calls on device {} are staged through page-locked host \
                 memory: {reason}",
                comm.rank,
                dev.ordinal()
            );
            None
        }
    }
}

/// The copy stream of the direct path, or why it is not taken.
fn probe(comm: &Comm, dev: &Device) -> std::result::Result<Stream, String> {
    let t = comm.transport();
    let provider = &t.caps().provider;
    if comm.device_direct == DeviceDirect::Off {
        return Err("FABRICOLL_DEVICE_DIRECT=off".into());
    }
    if !t.caps().hmem {
        return Err(format!("provider {provider} does not offer FI_HMEM"));
    }
    let fail = |e: Error| format!("registering device memory with provider {provider} failed: {e}");
    dev.make_current().map_err(fail)?;
    let buf = dev.alloc(PROBE_BYTES).map_err(fail)?;
    // SAFETY: the buffer is device memory of PROBE_BYTES, alive until after the registration
    // is dropped below; nothing reads or writes it.
    let region = unsafe { Region::from_raw(buf.addr() as *mut u8, buf.len()) };
    let mr = t.register_device(region, dev.ordinal()).map_err(fail)?;
    drop(mr);
    drop(buf);
    dev.create_stream().map_err(fail)
}

/// A call on the direct path: its one host-engine call, made when it may start.
pub(super) struct Direct {
    input: Option<Span>,
    output: Option<Span>,
    ctx: Arc<Ctx>,
    req: Option<RequestId>,
    /// The started call's device memory, shared with its executor.
    mem: Option<Arc<DevMem>>,
}

impl Direct {
    /// `call` on the direct path, where it can take it: its buffers are device memory (a
    /// missing side aside), it is uncompressed, and its buffers hold its blocks back to back
    /// (as the host call's layout has them). None: staged.
    pub fn new(
        call: &DevCall,
        blocks: &Blocks,
        compress: Compression,
        ctx: Arc<Ctx>,
    ) -> Result<Option<(Direct, Slice)>> {
        let elem = call.dtype.size();
        let (ie, oe) = blocks.extent();
        let side = |addr: u64, kind: Option<PtrKind>, len: usize, name: &str| match kind {
            None => Ok(Some(None)),
            Some(_) if len == 0 => Ok(Some(None)),
            // SAFETY: `DevCall::classify`'s caller promised the buffer valid for the call's
            // length until it completes.
            Some(PtrKind::Device { .. }) => unsafe {
                Span::from_raw(call.device(), addr, len * elem, name).map(|s| Some(Some(s)))
            },
            Some(_) => Ok(None),
        };
        let (Some(input), Some(output)) = (
            side(call.send, call.kinds[0], ie, "sendbuf")?,
            side(call.recv, call.kinds[1], oe, "recvbuf")?,
        ) else {
            return Ok(None);
        };
        if compress.codec().is_some() {
            return Ok(None);
        }
        let per = blocks.longest().max(1);
        let Some(slice) = super::slices::slices(blocks, elem, per, 1).pop() else {
            return Ok(None);
        };
        let packed = slice
            .input
            .iter()
            .chain(&slice.output)
            .all(|p| p.user == p.slot);
        // Every collective's schedule runs on device memory but AllToAllV's (refused here, its
        // slices would need every rank's counts: `DevCall::with_spec`) and Barrier's (no data).
        let covered = !matches!(
            call.kind,
            Kind::Varied(l) if matches!(l.coll, Varied::AllToAllV | Varied::Barrier)
        );
        if !packed || !covered {
            return Ok(None);
        }
        let d = Direct {
            input,
            output,
            ctx,
            req: None,
            mem: None,
        };
        Ok(Some((d, slice)))
    }

    /// Starts the call's host-engine call on `slice` (the call whole), the first time it is
    /// stepped; then whether that call has finished.
    pub fn start(&mut self, comm: &Comm, call: &DevCall, slice: &Slice) -> Result<()> {
        let mem = DevMem::new(comm, call.device(), &self.input, &self.output, &self.ctx)?;
        let send = mem.input.as_ref().map(|s| s.addr());
        let recv = self.output.as_ref().map(|s| s.addr());
        let c = super::slices::call(call, slice, send, recv);
        let mem = Arc::new(mem);
        self.mem = Some(mem.clone());
        self.req = Some(comm.start_device(&c, mem)?);
        Ok(())
    }

    /// Whether the started call has finished.
    pub fn test(&mut self, comm: &Comm) -> Result<bool> {
        match self.req {
            Some(r) if comm.test(r)? => {
                self.req = None;
                self.mem = None;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

impl Drop for Direct {
    /// A call dropped before it finished failed: the transport may still write its device
    /// memory, which is then never given back (as a failed staged call's slots).
    fn drop(&mut self) {
        if let (Some(_), Some(m)) = (self.req, &self.mem) {
            m.failed.store(true, Ordering::Relaxed);
        }
    }
}

/// One direct call's device memory as the executor sees it: the registrations of its buffers
/// (an in-place input's copy aside in place of the input), and the communicator's copy stream
/// and spare buffers.
struct DevMem {
    dev: Device,
    transport: Arc<dyn Transport>,
    ctx: Arc<Ctx>,
    timeout: Timeout,
    mrs: Vec<Mr>,
    /// The input the call reads (the caller's, or its copy aside).
    input: Option<Span>,
    /// The copy aside of an in-place input, held until the call's executor lets go.
    aside: Option<Held>,
    /// The schedule's Tmp memory and staging on the device (`DeviceMem::scratch`).
    scratch: OnceLock<Held>,
    /// The call failed: its buffers are leaked, not given back.
    failed: AtomicBool,
}

impl DevMem {
    fn new(
        comm: &Comm,
        dev: &Device,
        input: &Option<Span>,
        output: &Option<Span>,
        ctx: &Arc<Ctx>,
    ) -> Result<DevMem> {
        dev.make_current()?;
        let t = comm.transport();
        let overlap = match (input, output) {
            (Some(i), Some(o)) => {
                i.addr() < o.addr() + o.len() as u64 && o.addr() < i.addr() + i.len() as u64
            }
            _ => false,
        };
        let mut mem = DevMem {
            dev: dev.clone(),
            transport: t.clone(),
            ctx: ctx.clone(),
            timeout: comm.timeout,
            mrs: Vec::new(),
            input: input.clone(),
            aside: None,
            scratch: OnceLock::new(),
            failed: AtomicBool::new(false),
        };
        if let (Some(i), true) = (input, overlap) {
            let h = ctx.take(&**t, dev, i.len())?;
            let copy = h.buf.slice(0..i.len())?;
            // Held by `mem` from here, so given back however this ends.
            mem.aside = Some(h);
            ctx.stream.copy(&copy, i)?;
            ctx.stream.synchronize(comm.timeout)?;
            mem.input = Some(copy);
        }
        // The caller's buffers: the input too, unless the call reads its copy aside.
        let input = if mem.aside.is_some() { &None } else { input };
        for s in input.iter().chain(output) {
            // SAFETY: the span is the caller's device memory, valid until the call completes.
            let r = unsafe { Region::from_raw(s.addr() as *mut u8, s.len()) };
            mem.mrs.push(t.register_device(r, dev.ordinal())?);
        }
        Ok(mem)
    }

    fn span(&self, r: Region, name: &str) -> Result<Span> {
        // SAFETY: the executor's regions lie in the call's buffers (device memory registered
        // here), valid until the call completes.
        unsafe { Span::from_raw(&self.dev, r.addr() as u64, r.len(), name) }
    }
}

impl DeviceMem for DevMem {
    fn mr(&self, r: Region) -> Option<&Mr> {
        let (a, n) = (r.addr(), r.len());
        let held = self.scratch.get().into_iter().chain(&self.aside);
        self.mrs
            .iter()
            .chain(held.map(|h| &h.mr))
            .find(|m| a >= m.region.addr() && a + n <= m.region.addr() + m.region.len())
    }

    fn scratch(&self, len: usize) -> Result<Region> {
        if let Some(h) = self.scratch.get() {
            return Ok(h.mr.region);
        }
        let h = self.ctx.take(&*self.transport, &self.dev, len)?;
        if let Err(h) = self.scratch.set(h) {
            self.ctx.give(h);
        }
        Ok(self.scratch.get().expect("set above").mr.region)
    }

    fn copy(&self, dst: Region, src: Region) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.dev.make_current()?;
        let (d, s) = (self.span(dst, "dst")?, self.span(src, "src")?);
        self.ctx.stream.copy(&d, &s)?;
        self.ctx.stream.synchronize(self.timeout)
    }

    fn reduce(&self, dt: DataType, op: RedOp, dst: Region, a: Region, b: Region) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.dev.make_current()?;
        let (d, a, b) = (
            self.span(dst, "dst")?,
            self.span(a, "a")?,
            self.span(b, "b")?,
        );
        self.ctx.stream.reduce2(dt, op, &d, &a, &b)?;
        self.ctx.stream.synchronize(self.timeout)
    }

    fn scale_avg(&self, dt: DataType, dst: Region, n: usize) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        self.dev.make_current()?;
        self.ctx.stream.scale_avg(dt, &self.span(dst, "dst")?, n)?;
        self.ctx.stream.synchronize(self.timeout)
    }
}

impl Drop for DevMem {
    fn drop(&mut self) {
        for h in self.aside.take().into_iter().chain(self.scratch.take()) {
            if self.failed.load(Ordering::Relaxed) {
                std::mem::forget(h);
            } else {
                self.ctx.give(h);
            }
        }
    }
}
