//! Device memory for the plugins: what a pointer is (`pointer_device`), a small allocation of
//! our own (`DeviceAlloc`, for the registration probe), and making the network's writes into
//! device memory visible to the GPU (`flush_writes`, `read_sentinel`). Every function checks
//! that the probe found a usable driver first: cudarc panics when it has no libcuda to call.
use super::probe::{probe, Cuda};
use crate::error::{Error, Result};
use cudarc::driver::{result, sys};
use std::time::{Duration, Instant};

/// How long a sentinel read may take before `read_sentinel` gives up.
const SENTINEL_DEADLINE: Duration = Duration::from_secs(10);

fn driver_up() -> Result<()> {
    match probe() {
        Cuda::Up(_) => Ok(()),
        other => Err(Error::InvalidUsage(format!(
            "device memory needs CUDA: {}",
            other.why_not().unwrap_or("unusable")
        ))),
    }
}

fn failed(what: &str, e: result::DriverError) -> Error {
    let name = match e.error_name() {
        Ok(n) => n.to_string_lossy().into_owned(),
        Err(_) => format!("CUresult {}", e.0 as i32),
    };
    Error::System(format!("{what}: {name}"))
}

/// The CUDA device whose memory `addr` is; an error naming what it is otherwise (host memory,
/// managed memory, not a CUDA pointer at all).
pub fn pointer_device(addr: usize) -> Result<i32> {
    driver_up()?;
    let mut kind: u32 = 0;
    // SAFETY: the driver is up; `kind` is a valid place for the attribute (an unsigned int).
    let rc = unsafe {
        sys::cuPointerGetAttribute(
            (&mut kind as *mut u32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            addr as sys::CUdeviceptr,
        )
    };
    if let Err(e) = rc.result() {
        return Err(Error::arg(
            "data",
            format!(
                "{addr:#x} is not CUDA memory ({})",
                failed("cuPointerGetAttribute", e)
            ),
        ));
    }
    if kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
        return Err(Error::arg(
            "data",
            format!("{addr:#x} is CUDA memory of type {kind}, not device memory (2)"),
        ));
    }
    let mut ordinal: i32 = -1;
    // SAFETY: as above; the ordinal attribute is an int.
    unsafe {
        sys::cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            addr as sys::CUdeviceptr,
        )
    }
    .result()
    .map_err(|e| failed("cuPointerGetAttribute(DEVICE_ORDINAL)", e))?;
    Ok(ordinal)
}

/// Run `f` with the primary context of device `ordinal` current on this thread, and the
/// thread's own context current again after.
fn in_context<T>(ordinal: i32, f: impl FnOnce() -> Result<T>) -> Result<T> {
    driver_up()?;
    let dev = result::device::get(ordinal).map_err(|e| failed("cuDeviceGet", e))?;
    // SAFETY: the driver is up and `dev` is one of its devices.
    let ctx = unsafe { result::primary_ctx::retain(dev) }
        .map_err(|e| failed("cuDevicePrimaryCtxRetain", e))?;
    let before = result::ctx::get_current().unwrap_or(None);
    // SAFETY: `ctx` was just retained.
    let out = match unsafe { result::ctx::set_current(ctx) } {
        Ok(()) => f(),
        Err(e) => Err(failed("cuCtxSetCurrent", e)),
    };
    // SAFETY: `before` was current on this thread (or none was); the retain is ours to drop.
    unsafe {
        let _ = result::ctx::set_current(before.unwrap_or(std::ptr::null_mut()));
        let _ = result::primary_ctx::release(dev);
    }
    out
}

/// Device memory of our own, freed on drop.
pub struct DeviceAlloc {
    pub ptr: usize,
    pub len: usize,
    pub ordinal: i32,
}

impl DeviceAlloc {
    /// `len` bytes of device `ordinal`'s memory (cuMemAlloc in its primary context).
    pub fn new(ordinal: i32, len: usize) -> Result<DeviceAlloc> {
        in_context(ordinal, || {
            // SAFETY: a context is current (in_context).
            let ptr =
                unsafe { result::malloc_sync(len.max(1)) }.map_err(|e| failed("cuMemAlloc", e))?;
            Ok(DeviceAlloc {
                ptr: ptr as usize,
                len,
                ordinal,
            })
        })
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        let ptr = self.ptr as sys::CUdeviceptr;
        let r = in_context(self.ordinal, || {
            // SAFETY: `ptr` came from cuMemAlloc in this device's primary context.
            unsafe { result::free_sync(ptr) }.map_err(|e| failed("cuMemFree", e))
        });
        if let Err(e) = r {
            log::warn!("freeing our device buffer: {e}");
        }
    }
}

/// `cuFlushGPUDirectRDMAWrites(TARGET_CURRENT_CTX, TO_OWNER)` in device `ordinal`'s primary
/// context: the network's writes so far are visible to the GPU when it returns.
pub fn flush_writes(ordinal: i32) -> Result<()> {
    in_context(ordinal, || {
        use sys::CUflushGPUDirectRDMAWritesScope as Scope;
        use sys::CUflushGPUDirectRDMAWritesTarget as Target;
        // SAFETY: a context is current (in_context).
        unsafe {
            sys::cuFlushGPUDirectRDMAWrites(
                Target::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
                Scope::CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER,
            )
        }
        .result()
        .map_err(|e| failed("cuFlushGPUDirectRDMAWrites", e))
    })
}

/// Read one word of device memory at `addr` (device `ordinal`) on a stream of our own that
/// does not wait for the NULL stream (NCCL's kernels may be waiting for this very receive):
/// the read is ordered after the writes that landed before it. Polled to a deadline; past it,
/// the stream and the word it writes are left to the driver rather than waited for.
pub fn read_sentinel(ordinal: i32, addr: usize) -> Result<()> {
    in_context(ordinal, || {
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| failed("cuStreamCreate", e))?;
        let mut word = Box::new([0u8; 4]);
        // SAFETY: `stream` is ours; `addr` is device memory the caller received into, at
        // least 4 bytes (NCCL flushes non-empty receives); `word` stays allocated until the
        // copy is known to be done (or is leaked below).
        let copied = unsafe { result::memcpy_dtoh_async(&mut word[..], addr as _, stream) }
            .map_err(|e| failed("cuMemcpyDtoHAsync", e));
        let start = Instant::now();
        let done = copied.and_then(|()| loop {
            // SAFETY: `stream` is ours and alive.
            match unsafe { sys::cuStreamQuery(stream) } {
                sys::CUresult::CUDA_SUCCESS => break Ok(()),
                sys::CUresult::CUDA_ERROR_NOT_READY if start.elapsed() < SENTINEL_DEADLINE => {
                    std::thread::yield_now()
                }
                sys::CUresult::CUDA_ERROR_NOT_READY => {
                    break Err(Error::Timeout(format!(
                        "iflush: the sentinel read of {addr:#x} on CUDA device {ordinal} took \
                         more than {} s",
                        SENTINEL_DEADLINE.as_secs()
                    )))
                }
                other => break Err(failed("cuStreamQuery", result::DriverError(other))),
            }
        });
        if matches!(done, Err(Error::Timeout(_))) {
            // The copy may still write `word`: it and the stream stay.
            Box::leak(word);
            return done;
        }
        // SAFETY: the stream's only work has finished (or failed).
        unsafe {
            let _ = result::stream::destroy(stream);
        }
        done
    })
}
