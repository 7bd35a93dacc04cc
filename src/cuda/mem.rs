//! Device memory for the plugins' probe and flush: a small allocation of our own
//! (`DeviceAlloc`, for the registration probe, before any device seam is opened), a dma-buf
//! exporting it (`DmaBufFd`), and making the network's writes into device memory visible to the
//! GPU (`flush_writes`). Every function
//! checks that the probe found a usable driver first: cudarc panics when it has no libcuda.
use super::probe::{probe, Cuda};
use crate::error::{Error, Result};
use cudarc::driver::{result, sys};

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

/// Run `f` (which may make another context current on this thread: the device seam's `bind`)
/// and make the thread's own context current again after: NCCL's proxy thread calls the
/// plugin with its GPU's context current and goes on using it. Without a usable driver there
/// is no context to keep.
pub fn keeping_context<T>(f: impl FnOnce() -> T) -> T {
    if driver_up().is_err() {
        return f();
    }
    let before = result::ctx::get_current().unwrap_or(None);
    let out = f();
    // SAFETY: `before` was current on this thread (or none was), and is still alive: the
    // caller's context outlives its call into the plugin.
    let _ = unsafe { result::ctx::set_current(before.unwrap_or(std::ptr::null_mut())) };
    out
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

/// A dma-buf exporting a range of device memory (`cuMemGetHandleForAddressRange`), closed on
/// drop.
pub struct DmaBufFd {
    pub fd: i32,
}

impl DmaBufFd {
    /// Export `len` bytes of device `ordinal`'s memory at `ptr` (page-aligned, as the driver
    /// requires). Only for a device whose `dma_buf` attribute is set: drivers without it lack
    /// the function.
    pub fn export(ordinal: i32, ptr: usize, len: usize) -> Result<DmaBufFd> {
        in_context(ordinal, || {
            let mut fd: std::ffi::c_int = -1;
            // SAFETY: a context is current (in_context); `fd` is a valid place for the handle
            // (an int for the dma-buf type); the range is the caller's device memory.
            unsafe {
                sys::cuMemGetHandleForAddressRange(
                    (&mut fd as *mut std::ffi::c_int).cast(),
                    ptr as sys::CUdeviceptr,
                    len,
                    sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                    0,
                )
            }
            .result()
            .map_err(|e| failed("cuMemGetHandleForAddressRange", e))?;
            Ok(DmaBufFd { fd })
        })
    }
}

impl Drop for DmaBufFd {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours (the driver made it for us) and is closed once.
        unsafe { libc::close(self.fd) };
    }
}
