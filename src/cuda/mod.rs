//! CUDA, when a machine has it: whether the driver is usable (`probe`), what each device can
//! do, and what the plugins may therefore advertise (`caps`, pure decisions).
//!
//! The driver is reached through cudarc with dynamic loading: building needs no CUDA toolkit and
//! running needs no driver. cudarc panics when a function is called without libcuda, so nothing
//! here calls it before `probe` has found the library and initialised the driver; on a machine
//! without a GPU every caller sees `Cuda::Absent` and behaves as a host-only build.
pub mod caps;
pub mod mem;
mod probe;

pub use probe::{probe, version_string, Cuda, Device, Driver};

use crate::error::Result;
use crate::transport::{Caps, DmaBuf, Region};
use caps::{Facts, Registration};

/// Registers device memory of a CUDA device with the chosen provider and releases the
/// registration (`Transport::register_device` on an endpoint opened for the probe; with a
/// dma-buf, `Transport::register_dmabuf`).
pub type Register<'a> = &'a dyn Fn(Region, i32, Option<DmaBuf>) -> Result<()>;

/// Bytes of the buffer the registration probe allocates and registers.
pub const PROBE_BYTES: usize = 64 << 10;

/// The facts `caps::ptr_support` decides from, for device `ordinal` behind an endpoint with
/// these capabilities. `register` registers with the provider (None: no endpoint to try
/// with); it is called, once, only where every other condition for device memory holds.
pub fn facts(caps: &Caps, ordinal: i32, register: Option<Register>) -> Facts {
    let cuda = probe();
    let dev = cuda
        .driver()
        .and_then(|d| d.devices.iter().find(|d| d.ordinal == ordinal));
    // Registering a device buffer needs a device: without one there is nothing to try.
    let registration = match (cuda.why_not(), dev, register) {
        (Some(why), _, _) => Registration::NotTried(why.to_string()),
        (None, None, _) => Registration::NotTried(format!("no CUDA device {ordinal}")),
        (None, Some(d), _) if !d.gdr || !caps.hmem => {
            Registration::NotTried("an earlier condition already rules it out".into())
        }
        (None, Some(_), None) => {
            Registration::NotTried("there is no endpoint of the provider to try with".into())
        }
        (None, Some(_), Some(f)) => probe_registration(ordinal, f, false),
    };
    let libfabric = caps::parse_release(&crate::transport::fabric::runtime_version());
    let dmabuf = match (&registration, dev, register) {
        (Registration::Worked, Some(d), Some(f))
            if d.dma_buf && libfabric >= caps::LIBFABRIC_DMABUF =>
        {
            probe_registration(ordinal, f, true)
        }
        (Registration::Worked, ..) => {
            Registration::NotTried("an earlier condition already rules it out".into())
        }
        _ => Registration::NotTried("no device buffer was registered".into()),
    };
    Facts {
        cuda_down: cuda.why_not().map(str::to_string),
        device_gdr: dev.is_some_and(|d| d.gdr),
        device_dma_buf: dev.is_some_and(|d| d.dma_buf),
        provider_hmem: caps.hmem,
        provider: caps.provider.clone(),
        libfabric,
        kernel: kernel_release(),
        registration,
        dmabuf_registration: dmabuf,
    }
}

/// Register (and release at once) `PROBE_BYTES` of device `ordinal`'s memory with `register`:
/// by address, or (`dmabuf`) through a dma-buf exported for it as NCCL exports its buffers.
fn probe_registration(ordinal: i32, register: Register, dmabuf: bool) -> Registration {
    let buf = match mem::DeviceAlloc::new(ordinal, PROBE_BYTES) {
        Ok(b) => b,
        Err(e) => return Registration::NotTried(format!("no device buffer to register: {e}")),
    };
    let fd = if dmabuf {
        match mem::DmaBufFd::export(ordinal, buf.ptr, buf.len) {
            Ok(fd) => Some(fd),
            Err(e) => return Registration::Refused(format!("no dma-buf of a device buffer: {e}")),
        }
    } else {
        None
    };
    // SAFETY: `buf` is device memory of PROBE_BYTES, alive until after `register` has
    // released the registration; nothing accesses it from the host.
    let region = unsafe { Region::from_raw(buf.ptr as *mut u8, buf.len) };
    let how = fd.as_ref().map(|f| DmaBuf {
        fd: f.fd,
        offset: 0,
    });
    let r = match register(region, ordinal, how) {
        Ok(()) => Registration::Worked,
        Err(e) => Registration::Refused(e.to_string()),
    };
    drop(fd);
    drop(buf);
    r
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
