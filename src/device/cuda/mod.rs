//! The device seam on the CUDA driver, through cudarc's raw driver calls (loaded at run time).
//!
//! Reached only through `Device::cuda`, after `cuda::probe` found a usable driver: cudarc
//! panics when a function is called without libcuda, so nothing here runs before the probe.
//! Each device uses its primary context (the one the CUDA runtime, torch and NCCL use), made
//! current per thread by `bind`; streams are created non-blocking, never the legacy NULL
//! stream. Flags are 32-bit words in page-locked host memory mapped for the device:
//! `cuStreamWaitValue32_v2` (GEQ) and `cuStreamWriteValue32_v2`, or, where the device lacks
//! stream memory operations (found when the device is opened), a host function on the stream
//! that polls the word (until the flag's deadline; it then logs the flag's name and lets the
//! stream go on) or writes it. Device memory comes from the stream-ordered allocator where the
//! device has memory pools, so that freeing never waits for the device (see `mem_stream`).
mod kernels;

use std::ffi::c_void;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use cudarc::driver::sys;

use super::backend::{
    Backend, DeviceInfo, DeviceKind, HostAlloc, Kernel, PtrKind, RawEvent, RawStream,
};
use super::Device;
use crate::{Error, Result};

/// The reduction kernels' machine code (a cubin) for compute capability `cc`, as NVRTC
/// compiles it (once per process; the error says why it could not). Needs NVRTC, not a device.
pub fn kernels_image(cc: (i32, i32)) -> std::result::Result<std::sync::Arc<Vec<u8>>, String> {
    kernels::image(cc)
}

/// How long the fallback host function waits for a flag before it gives up (logging its name).
pub const FALLBACK_FLAG_WAIT: Duration = Duration::from_secs(600);

/// A driver call's result as ours, naming the call.
pub(super) fn check(r: sys::CUresult, what: &str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let name = r
        .result()
        .err()
        .and_then(|e| {
            e.error_name()
                .ok()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| format!("CUresult {}", r as i32));
    Err(match r {
        sys::CUresult::CUDA_ERROR_INVALID_VALUE | sys::CUresult::CUDA_ERROR_INVALID_HANDLE => {
            Error::InvalidArgument(format!("{what} failed: {name}"))
        }
        _ => Error::System(format!("{what} failed: {name}")),
    })
}

/// One device's primary context.
pub(super) struct Ctx {
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    pub(super) compute: (i32, i32),
}

// SAFETY: a CUcontext may be made current on, and used from, any thread.
unsafe impl Send for Ctx {}
// SAFETY: as for Send; the driver serialises what needs it.
unsafe impl Sync for Ctx {}

/// The CUDA implementation of `Backend`.
pub struct CudaBackend {
    c: Ctx,
    info: DeviceInfo,
    max_blocks: u32,
    /// What every backend of this device in the process shares (`Shared`).
    shared: &'static Shared,
}

/// What is set up once per device and process, when the first backend of the device opens,
/// and kept for the process's life: loading code or creating a stream waits for every stream
/// of the context to drain, so doing either while some stream waits for a flag that the
/// opening thread (or a rank on another thread) has yet to write would never return
/// (docs/device.md). A communicator's first device call, or a second rank of the process
/// opening the device, must therefore find everything here already made.
struct Shared {
    /// The reduction kernels, loaded in the primary context (or why they could not be).
    module: std::result::Result<kernels::Module, String>,
    /// Whether `cuStreamWaitValue32_v2` works (`try_mem_ops`).
    stream_mem_ops: bool,
    /// A private stream for the stream-ordered allocator (`cuMemAllocAsync` /
    /// `cuMemFreeAsync`), where the device has memory pools; None: `cuMemAlloc` / `cuMemFree`.
    /// `cuMemFree` may wait for the whole device, so a free while some stream waits for a flag
    /// the freeing thread has yet to write would never return; a free on this stream waits for
    /// nothing (the memory's users have completed: the seam holds buffers until then).
    mem_stream: Option<RawStream>,
}

impl Device {
    /// CUDA device `ordinal`, through its primary context; the calling thread is bound to it.
    /// Fails, saying why, where `cuda::probe` found no usable driver or no such device.
    pub fn cuda(ordinal: i32) -> Result<Device> {
        let driver = crate::cuda::probe().driver().ok_or_else(|| {
            Error::InvalidUsage(format!(
                "no CUDA device: {}",
                crate::cuda::probe()
                    .why_not()
                    .unwrap_or("the driver is unusable")
            ))
        })?;
        let d = driver
            .devices
            .iter()
            .find(|d| d.ordinal == ordinal)
            .ok_or_else(|| {
                Error::arg(
                    "ordinal",
                    format!(
                        "no CUDA device {ordinal} (the driver reports {})",
                        driver.devices.len()
                    ),
                )
            })?;
        let b = CudaBackend::open(ordinal, d.name.clone(), d.compute)?;
        Ok(Device::from_backend(std::sync::Arc::new(b)))
    }
}

impl CudaBackend {
    fn open(ordinal: i32, name: String, compute: (i32, i32)) -> Result<CudaBackend> {
        let mut dev: sys::CUdevice = 0;
        check(
            // SAFETY: the probe initialised the driver; `dev` is a valid place for the handle.
            unsafe { sys::cuDeviceGet(&mut dev, ordinal) },
            "cuDeviceGet",
        )?;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        check(
            // SAFETY: `dev` is a device handle; retaining its primary context is balanced in Drop.
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        let sms = attribute(
            dev,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        );
        let c = Ctx { dev, ctx, compute };
        let info = DeviceInfo {
            kind: DeviceKind::Cuda,
            ordinal,
            name,
            compute,
            stream_mem_ops: true,
        };
        // SAFETY: `c` holds the retain taken above; `bind` makes it current.
        let bind = unsafe { sys::cuCtxSetCurrent(c.ctx) };
        let shared = match check(bind, "cuCtxSetCurrent").and_then(|_| Shared::get(&c, ordinal)) {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: balances the retain above (the backend is not built).
                let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(dev) };
                return Err(e);
            }
        };
        let b = CudaBackend {
            c,
            info: DeviceInfo {
                stream_mem_ops: shared.stream_mem_ops,
                ..info
            },
            max_blocks: u32::try_from(sms.max(1) * 16).unwrap_or(1024),
            shared,
        };
        b.bind()?;
        Ok(b)
    }
    /// Runs `f` with the context current on this thread (pushed and popped if it was not):
    /// for frees and destroys, which may run on any thread.
    fn with_ctx<T>(&self, f: impl FnOnce() -> T) -> T {
        if self.check_current().is_ok() {
            return f();
        }
        // SAFETY: pushing a retained context, popped below.
        let pushed = unsafe { sys::cuCtxPushCurrent_v2(self.c.ctx) } == sys::CUresult::CUDA_SUCCESS;
        let out = f();
        if pushed {
            let mut old: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: pops what was pushed above.
            let _ = unsafe { sys::cuCtxPopCurrent_v2(&mut old) };
        }
        out
    }

    fn module(&self) -> Result<&kernels::Module> {
        self.shared
            .module
            .as_ref()
            .map_err(|e| Error::InvalidUsage(format!("device reduction kernels: {e}")))
    }
}

impl Shared {
    /// The device's shared set-up, made now if this is the process's first backend of it.
    /// `c`'s context is current on this thread.
    fn get(c: &Ctx, ordinal: i32) -> Result<&'static Shared> {
        type Table = parking_lot::Mutex<std::collections::HashMap<i32, &'static Shared>>;
        static TABLE: OnceLock<Table> = OnceLock::new();
        let mut t = TABLE.get_or_init(Default::default).lock();
        if let Some(s) = t.get(&ordinal) {
            return Ok(s);
        }
        let mut keep: sys::CUcontext = std::ptr::null_mut();
        check(
            // SAFETY: `c.dev` is a device handle. This retain is never released: the module
            // and the stream below live in the context for the rest of the process.
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut keep, c.dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        let pools = attribute(
            c.dev,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
        );
        let mem_stream = if pools != 0 {
            Some(raw_stream_create()?)
        } else {
            None
        };
        let stream_mem_ops = try_mem_ops()?;
        if !stream_mem_ops {
            log::warn!(
                "CUDA device {ordinal}: no stream memory operations; flag waits run as host \
                 functions on the stream"
            );
        }
        let module = kernels::Module::load(c);
        if let Err(e) = &module {
            log::info!("CUDA device {ordinal}: no reduction kernels: {e}");
        }
        let s: &'static Shared = Box::leak(Box::new(Shared {
            module,
            stream_mem_ops,
            mem_stream,
        }));
        t.insert(ordinal, s);
        Ok(s)
    }
}

// SAFETY: the stream handle may be used from any thread with the context; nothing else here
// is tied to a thread.
unsafe impl Send for Shared {}
// SAFETY: as for Send; enqueueing on one stream from several threads is allowed.
unsafe impl Sync for Shared {}

/// Attribute `a` of device `dev` (0 where the driver does not say).
fn attribute(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> i32 {
    let mut v = 0;
    // SAFETY: `dev` is a device handle the driver gave; `v` is a place for one int.
    let _ = unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) };
    v
}

/// A non-blocking stream in the current context.
fn raw_stream_create() -> Result<RawStream> {
    let mut s: sys::CUstream = std::ptr::null_mut();
    check(
        // SAFETY: a context is current; `s` is a place for the handle.
        unsafe { sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) },
        "cuStreamCreate",
    )?;
    Ok(RawStream(s as u64))
}

/// Whether `cuStreamWaitValue32_v2` works in the current context: one wait on a word that
/// already holds the value, on a scratch stream.
fn try_mem_ops() -> Result<bool> {
    let mut host: *mut c_void = std::ptr::null_mut();
    check(
        // SAFETY: a context is current; 64 bytes, page-locked and mapped for the device.
        unsafe {
            sys::cuMemHostAlloc(
                &mut host,
                64,
                sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP,
            )
        },
        "cuMemHostAlloc",
    )?;
    let mut dev: sys::CUdeviceptr = 0;
    // SAFETY: `host` was just allocated mapped; `dev` is a place for its device address.
    let r = check(
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) },
        "cuMemHostGetDevicePointer",
    );
    let s = r.and_then(|_| raw_stream_create());
    let out = s.and_then(|s| {
        // SAFETY: the word is written before any stream reads it.
        unsafe { std::ptr::write_volatile(host.cast::<u32>(), 1) };
        // SAFETY: `s` is live and `dev` the device address of the word.
        let w = unsafe { sys::cuStreamWaitValue32_v2(stream(s), dev, 1, 0) };
        // SAFETY: `s` is live; synchronising a stream whose only work is a satisfied wait.
        let sync = unsafe { sys::cuStreamSynchronize(stream(s)) };
        // SAFETY: the stream is idle; destroyed once.
        let _ = unsafe { sys::cuStreamDestroy_v2(stream(s)) };
        match w {
            sys::CUresult::CUDA_SUCCESS => check(sync, "cuStreamSynchronize").map(|_| true),
            sys::CUresult::CUDA_ERROR_NOT_SUPPORTED => Ok(false),
            e => check(e, "cuStreamWaitValue32").map(|_| false),
        }
    });
    // SAFETY: allocated above; no stream uses it any more.
    let _ = unsafe { sys::cuMemFreeHost(host) };
    out
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `open`.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.c.dev) };
    }
}

fn stream(s: RawStream) -> sys::CUstream {
    s.0 as sys::CUstream
}

fn event(e: RawEvent) -> sys::CUevent {
    e.0 as sys::CUevent
}

/// The fallback flag wait: a host function on the stream polls the word.
struct HostWait {
    word: *const u32,
    value: u32,
    name: String,
}

unsafe extern "C" fn host_wait(p: *mut c_void) {
    // SAFETY: `p` is the Box<HostWait> leaked by stream_wait_value, taken back once here.
    let w = unsafe { Box::from_raw(p.cast::<HostWait>()) };
    // SAFETY: the word is page-locked memory held alive by the stream until this completes.
    let word = unsafe { std::sync::atomic::AtomicU32::from_ptr(w.word.cast_mut()) };
    let start = Instant::now();
    while !super::reached(word.load(std::sync::atomic::Ordering::Acquire), w.value) {
        if start.elapsed() >= FALLBACK_FLAG_WAIT {
            log::error!(
                "flag '{}' did not reach {} within {} s: the stream goes on",
                w.name,
                w.value,
                FALLBACK_FLAG_WAIT.as_secs()
            );
            return;
        }
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// The fallback flag write.
unsafe extern "C" fn host_write(p: *mut c_void) {
    // SAFETY: `p` is the Box leaked by stream_write_value, taken back once here.
    let (word, value) = *unsafe { Box::from_raw(p.cast::<(*const u32, u32)>()) };
    // SAFETY: as in host_wait.
    unsafe { std::sync::atomic::AtomicU32::from_ptr(word.cast_mut()) }
        .store(value, std::sync::atomic::Ordering::Release);
}

impl Backend for CudaBackend {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained for the backend's life.
        check(
            unsafe { sys::cuCtxSetCurrent(self.c.ctx) },
            "cuCtxSetCurrent",
        )
    }

    fn check_current(&self) -> Result<()> {
        let mut cur: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `cur` is a valid place for a handle.
        check(unsafe { sys::cuCtxGetCurrent(&mut cur) }, "cuCtxGetCurrent")?;
        if cur != self.c.ctx {
            return Err(Error::InvalidUsage(format!(
                "CUDA device {}'s context is not current on this thread (call Device::bind, \
                 or cudaSetDevice({}), on it first)",
                self.info.ordinal, self.info.ordinal
            )));
        }
        Ok(())
    }

    fn alloc(&self, len: usize) -> Result<u64> {
        let mut p: sys::CUdeviceptr = 0;
        let Some(ms) = self.shared.mem_stream else {
            // SAFETY: the context is current (checked by the caller); `p` is a valid place.
            check(unsafe { sys::cuMemAlloc_v2(&mut p, len) }, "cuMemAlloc")?;
            return Ok(p);
        };
        // SAFETY: as above, on the allocator's live stream.
        let r = unsafe { sys::cuMemAllocAsync(&mut p, len, stream(ms)) };
        check(r, "cuMemAllocAsync")?;
        // Usable by every stream once the allocation has happened; the allocator's stream has
        // no other work (frees), so this waits for nothing else.
        // SAFETY: the allocator's stream is live.
        let r = unsafe { sys::cuStreamSynchronize(stream(ms)) };
        if let Err(e) = check(r, "cuStreamSynchronize (allocation)") {
            // SAFETY: freeing what was just allocated, unused.
            let _ = unsafe { sys::cuMemFreeAsync(p, stream(ms)) };
            return Err(e);
        }
        Ok(p)
    }

    unsafe fn free(&self, addr: u64, _len: usize) {
        let r = match self.shared.mem_stream {
            // SAFETY: the caller guarantees `addr` is ours (from cuMemAllocAsync) and unused.
            Some(ms) => self.with_ctx(|| unsafe { sys::cuMemFreeAsync(addr, stream(ms)) }),
            // SAFETY: the caller guarantees `addr` is ours (from cuMemAlloc) and unused.
            None => self.with_ctx(|| unsafe { sys::cuMemFree_v2(addr) }),
        };
        if let Err(e) = check(r, "cuMemFree") {
            log::error!("{e}");
        }
    }

    fn alloc_host(&self, len: usize) -> Result<HostAlloc> {
        let mut p: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        check(
            // SAFETY: the context is current; `p` is a valid place.
            unsafe { sys::cuMemHostAlloc(&mut p, len, flags) },
            "cuMemHostAlloc",
        )?;
        let mut d: sys::CUdeviceptr = 0;
        // SAFETY: `p` was just allocated with DEVICEMAP.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0) };
        if let Err(e) = check(r, "cuMemHostGetDevicePointer") {
            // SAFETY: freeing what was allocated above, unused.
            let _ = unsafe { sys::cuMemFreeHost(p) };
            return Err(e);
        }
        Ok(HostAlloc {
            host: p.cast(),
            device: d,
            len,
        })
    }

    unsafe fn free_host(&self, a: HostAlloc) {
        // SAFETY: the caller guarantees the allocation is ours and unused.
        let r = self.with_ctx(|| unsafe { sys::cuMemFreeHost(a.host.cast()) });
        if let Err(e) = check(r, "cuMemFreeHost") {
            log::error!("{e}");
        }
    }

    fn classify(&self, addr: u64) -> Result<PtrKind> {
        use sys::CUpointer_attribute as A;
        let mut attrs = [
            A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            A::CU_POINTER_ATTRIBUTE_IS_MANAGED,
        ];
        let (mut mem_type, mut ordinal, mut managed) = (0u32, -1i32, 0u32);
        let mut data: [*mut c_void; 3] = [
            (&mut mem_type as *mut u32).cast(),
            (&mut ordinal as *mut i32).cast(),
            (&mut managed as *mut u32).cast(),
        ];
        check(
            // SAFETY: three attributes, each with a place of its size (unsigned int, int,
            // unsigned int); an address the driver does not know gives the defaults (0), not an
            // error.
            unsafe { sys::cuPointerGetAttributes(3, attrs.as_mut_ptr(), data.as_mut_ptr(), addr) },
            "cuPointerGetAttributes",
        )?;
        Ok(if managed != 0 {
            PtrKind::Managed
        } else if mem_type == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            PtrKind::Device { ordinal }
        } else if mem_type == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32 {
            PtrKind::PinnedHost
        } else {
            PtrKind::Host
        })
    }

    fn stream_create(&self) -> Result<RawStream> {
        raw_stream_create()
    }

    unsafe fn stream_adopt(&self, handle: u64) -> Result<RawStream> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // cudarc panics where the driver lacks the function: a guard, not a path taken (every
        // driver since CUDA 9.2 has it).
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            // SAFETY: the caller guarantees a live stream; `ctx` is a valid place.
            unsafe { sys::cuStreamGetCtx(handle as sys::CUstream, &mut ctx) }
        }))
        .map_err(|_| Error::System("the CUDA driver lacks cuStreamGetCtx".into()))?;
        check(r, "cuStreamGetCtx (argument 'stream')")?;
        if ctx != self.c.ctx {
            return Err(Error::arg(
                "stream",
                format!(
                    "{handle:#x} belongs to another context than CUDA device {}'s primary one",
                    self.info.ordinal
                ),
            ));
        }
        Ok(RawStream(handle))
    }

    unsafe fn stream_destroy(&self, s: RawStream) {
        // SAFETY: the caller guarantees the stream is ours and destroyed once.
        let r = self.with_ctx(|| unsafe { sys::cuStreamDestroy_v2(stream(s)) });
        if let Err(e) = check(r, "cuStreamDestroy") {
            log::error!("{e}");
        }
    }

    unsafe fn stream_query(&self, s: RawStream) -> Result<bool> {
        // SAFETY: the caller guarantees a live stream.
        match unsafe { sys::cuStreamQuery(stream(s)) } {
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => check(r, "cuStreamQuery").map(|_| true),
        }
    }

    unsafe fn copy(&self, s: RawStream, dst: u64, src: u64, len: usize) -> Result<()> {
        // SAFETY: the caller guarantees the stream and both ranges (unified addresses).
        check(
            unsafe { sys::cuMemcpyAsync(dst, src, len, stream(s)) },
            "cuMemcpyAsync",
        )
    }

    unsafe fn launch(&self, s: RawStream, k: &Kernel) -> Result<()> {
        // SAFETY: forwarded from the caller; the context is current.
        unsafe { self.module()?.launch(s, k, self.max_blocks) }
    }

    fn event_create(&self) -> Result<RawEvent> {
        let mut e: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        check(
            // SAFETY: the context is current; `e` is a valid place.
            unsafe { sys::cuEventCreate(&mut e, flags) },
            "cuEventCreate",
        )?;
        Ok(RawEvent(e as u64))
    }

    unsafe fn event_destroy(&self, e: RawEvent) {
        // SAFETY: the caller guarantees the event is ours and destroyed once.
        let r = self.with_ctx(|| unsafe { sys::cuEventDestroy_v2(event(e)) });
        if let Err(e) = check(r, "cuEventDestroy") {
            log::error!("{e}");
        }
    }

    unsafe fn event_record(&self, e: RawEvent, s: RawStream) -> Result<()> {
        // SAFETY: the caller guarantees both are live.
        check(
            unsafe { sys::cuEventRecord(event(e), stream(s)) },
            "cuEventRecord",
        )
    }

    unsafe fn event_query(&self, e: RawEvent) -> Result<bool> {
        // SAFETY: the caller guarantees a live event.
        let r = self.with_ctx(|| unsafe { sys::cuEventQuery(event(e)) });
        match r {
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            r => check(r, "cuEventQuery").map(|_| true),
        }
    }

    unsafe fn stream_wait_event(&self, s: RawStream, e: RawEvent) -> Result<()> {
        // SAFETY: the caller guarantees both are live.
        check(
            unsafe { sys::cuStreamWaitEvent(stream(s), event(e), 0) },
            "cuStreamWaitEvent",
        )
    }

    unsafe fn stream_wait_value(
        &self,
        s: RawStream,
        addr: u64,
        value: u32,
        name: &str,
    ) -> Result<()> {
        if self.info.stream_mem_ops {
            let geq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
            // SAFETY: the caller guarantees the stream and the page-locked word at `addr`.
            return check(
                unsafe { sys::cuStreamWaitValue32_v2(stream(s), addr, value, geq) },
                &format!("cuStreamWaitValue32 (flag '{name}')"),
            );
        }
        let w = Box::into_raw(Box::new(HostWait {
            word: addr as *const u32,
            value,
            name: name.to_string(),
        }));
        // SAFETY: `host_wait` takes the box back exactly once when the stream runs it; under
        // unified addressing the word's device address is its host address.
        let r = unsafe { sys::cuLaunchHostFunc(stream(s), Some(host_wait), w.cast()) };
        if r != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: not enqueued, so never run: the box is still ours.
            drop(unsafe { Box::from_raw(w) });
        }
        check(r, "cuLaunchHostFunc (flag wait)")
    }

    unsafe fn stream_write_value(&self, s: RawStream, addr: u64, value: u32) -> Result<()> {
        if self.info.stream_mem_ops {
            let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
            // SAFETY: the caller guarantees the stream and the page-locked word at `addr`.
            return check(
                unsafe { sys::cuStreamWriteValue32_v2(stream(s), addr, value, flags) },
                "cuStreamWriteValue32",
            );
        }
        let w = Box::into_raw(Box::new((addr as *const u32, value)));
        // SAFETY: as in stream_wait_value.
        let r = unsafe { sys::cuLaunchHostFunc(stream(s), Some(host_write), w.cast()) };
        if r != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: not enqueued: the box is still ours.
            drop(unsafe { Box::from_raw(w) });
        }
        check(r, "cuLaunchHostFunc (flag write)")
    }
}
