//! The device seam: the few things the engines need from a GPU, behind one interface, with two
//! implementations: the CUDA driver (`cuda`, through cudarc, loaded at run time) and an
//! emulated device (`emu`, a test tool that every CI run uses; never a fallback for users).
//!
//! - memory: `Device::alloc` (device memory) and `Device::alloc_host` (page-locked host memory
//!   mapped for the device), owning buffers whose Drop frees, and `Span`s of them (or of a
//!   caller's pointer, `Span::from_raw`) for stream operations; a buffer a stream still uses is
//!   freed only once that work completes (`memory`);
//! - streams (`Stream`): asynchronous copies between device and page-locked memory, the
//!   reduction kernels (`reduce`, `reduce2`, `scale_avg`), synchronous `upload` / `download`
//!   for pageable host memory; a caller's stream is wrapped without being owned, and the legacy
//!   and per-thread default streams are refused;
//! - `Event`s, recorded on a stream and polled (querying one never recorded is an error);
//! - `Flag`s: a stream waits for a word the host writes, or writes one the host polls;
//! - `Device::classify`: host, page-locked host, device (which one), managed memory.
//!
//! Every call needs the device's context current on the calling thread (`Device::bind`), as
//! CUDA does; without it the call fails with `InvalidUsage`. Every wait takes a deadline. See
//! docs/device.md for the waiting mechanism and the rounding of the float kernels.
mod backend;
pub mod cuda;
pub mod emu;
mod event;
mod flag;
pub mod kernels;
mod memory;
mod stream;

pub use backend::{
    Backend, DeviceInfo, DeviceKind, HostAlloc, Kernel, PtrKind, RawEvent, RawStream,
};
pub use emu::EmuConfig;
pub use event::Event;
pub use flag::{reached, Flag};
pub use memory::{DeviceBuffer, HostBuffer, Span};
pub(crate) use stream::backoff_to;
pub use stream::{Stream, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD, LEGACY_STREAM};

use std::ffi::c_void;
use std::sync::Arc;

use crate::Result;

/// One device (a handle: clones share it).
#[derive(Clone)]
pub struct Device {
    backend: Arc<dyn Backend>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = self.info();
        write!(f, "Device({:?} {} '{}')", i.kind, i.ordinal, i.name)
    }
}

impl Device {
    /// A device over a backend (the two in this module, or a test's own).
    pub fn from_backend(backend: Arc<dyn Backend>) -> Device {
        Device { backend }
    }

    pub(crate) fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    pub(crate) fn backend_arc(&self) -> Arc<dyn Backend> {
        self.backend.clone()
    }

    pub fn info(&self) -> &DeviceInfo {
        self.backend.info()
    }

    pub fn kind(&self) -> DeviceKind {
        self.info().kind
    }

    pub fn ordinal(&self) -> i32 {
        self.info().ordinal
    }

    /// Makes the device's context current on the calling thread (each thread that calls into
    /// the device does this once; CUDA: the device's primary context).
    pub fn bind(&self) -> Result<()> {
        self.backend.bind()
    }

    /// Ok where the device's context is current on this thread; else `InvalidUsage`.
    pub fn check_current(&self) -> Result<()> {
        self.backend.check_current()
    }

    /// `bind` where the device's context is not current on this thread yet (as NCCL's and
    /// torch's threads set their device: the primary context on CUDA).
    pub fn make_current(&self) -> Result<()> {
        if self.check_current().is_err() {
            self.bind()?;
        }
        Ok(())
    }

    /// `len` bytes of device memory.
    pub fn alloc(&self, len: usize) -> Result<DeviceBuffer> {
        DeviceBuffer::new(self, len)
    }

    /// `len` bytes of page-locked host memory, mapped for the device.
    pub fn alloc_host(&self, len: usize) -> Result<HostBuffer> {
        HostBuffer::new(self, len)
    }

    /// A new stream (never the legacy NULL stream), destroyed on Drop.
    pub fn create_stream(&self) -> Result<Stream> {
        Stream::create(self)
    }

    /// A caller's stream (a `CUstream` passed through the C API), used without being owned.
    /// The legacy default stream (0, `CU_STREAM_LEGACY` = 1) and the per-thread default stream
    /// (`CU_STREAM_PER_THREAD` = 2) are an `InvalidArgument` naming `stream`.
    ///
    /// # Safety
    /// `handle` is a live stream of this device, and stays so while the result exists.
    pub unsafe fn wrap_stream(&self, handle: *mut c_void) -> Result<Stream> {
        // SAFETY: forwarded from the caller.
        unsafe { Stream::wrap(self, handle) }
    }

    pub fn create_event(&self) -> Result<Event> {
        Event::create(self)
    }

    /// A flag word, starting at 0; `name` names it in errors.
    pub fn create_flag(&self, name: &str) -> Result<Flag> {
        Flag::new(self, name)
    }

    /// What `ptr` points to.
    pub fn classify(&self, ptr: *const c_void) -> Result<PtrKind> {
        self.check_current()?;
        self.backend.classify(ptr as u64)
    }
}
