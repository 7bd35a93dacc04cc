//! CUDA, when a machine has it: whether the driver is usable (`probe`), what each device can
//! do, and what the plugins may therefore advertise (`caps`, pure decisions).
//!
//! The driver is reached through cudarc with dynamic loading: building needs no CUDA toolkit and
//! running needs no driver. cudarc panics when a function is called without libcuda, so nothing
//! here calls it before `probe` has found the library and initialised the driver; on a machine
//! without a GPU every caller sees `Cuda::Absent` and behaves as a host-only build.
pub mod caps;
mod probe;

pub use probe::{probe, version_string, Cuda, Device, Driver};

use crate::transport::Caps;
use caps::{Facts, Registration};

/// The facts `caps::ptr_support` decides from, for device `ordinal` behind an endpoint with
/// these capabilities.
pub fn facts(caps: &Caps, ordinal: i32) -> Facts {
    let cuda = probe();
    let dev = cuda
        .driver()
        .and_then(|d| d.devices.iter().find(|d| d.ordinal == ordinal));
    // Registering a device buffer needs a device: without one there is nothing to try.
    let not_tried = match (cuda.why_not(), dev) {
        (Some(why), _) => why.to_string(),
        (None, None) => format!("no CUDA device {ordinal}"),
        (None, Some(_)) => "this build does not register device memory yet".into(),
    };
    Facts {
        cuda_down: cuda.why_not().map(str::to_string),
        device_gdr: dev.is_some_and(|d| d.gdr),
        device_dma_buf: dev.is_some_and(|d| d.dma_buf),
        provider_hmem: caps.hmem,
        provider: caps.provider.clone(),
        libfabric: caps::parse_release(&crate::transport::fabric::runtime_version()),
        kernel: kernel_release(),
        registration: Registration::NotTried(not_tried.clone()),
        dmabuf_registration: Registration::NotTried(not_tried),
    }
}

/// The device of the CUDA context current on the calling thread: None where the driver is not
/// up (`probe`) or no context is current (the thread has made no CUDA call).
pub fn current_device() -> Option<i32> {
    use cudarc::driver::sys;
    probe().driver()?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: the probe found and initialised the driver; `ctx` is a valid place for a handle.
    if unsafe { sys::cuCtxGetCurrent(&mut ctx) } != sys::CUresult::CUDA_SUCCESS || ctx.is_null() {
        return None;
    }
    let mut dev: sys::CUdevice = 0;
    // SAFETY: a context is current on this thread; `dev` is a valid place for the ordinal.
    (unsafe { sys::cuCtxGetDevice(&mut dev) } == sys::CUresult::CUDA_SUCCESS).then_some(dev)
}

/// The running kernel's (major, minor), from uname(2).
fn kernel_release() -> (u32, u32) {
    // SAFETY: utsname is plain bytes; all-zero is a valid value for uname to fill.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable utsname.
    if unsafe { libc::uname(&mut u) } != 0 {
        return (0, 0);
    }
    // SAFETY: uname NUL-terminates `release` within the array.
    let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) };
    caps::parse_release(&release.to_string_lossy())
}
