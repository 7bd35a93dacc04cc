//! The seam itself: what an implementation of a device provides (`Backend`), on raw addresses
//! and handles. The public types (`Device`, `Stream`, `Event`, `Flag`, the buffers) hold the
//! bookkeeping common to both implementations (which buffers a stream still uses, whether an
//! event was recorded, which flags a stream waits for) and call this trait; a backend only
//! translates each call to its device.
//!
//! Every method runs on the caller's thread, after the public layer has checked the arguments
//! and that the device's context is current there (`check_current`).
use crate::reduce::{DataType, RedOp};
use crate::Result;

/// Which implementation a `Device` is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceKind {
    /// The CUDA driver through cudarc.
    Cuda,
    /// The emulated device (a test tool; see `device::emu`).
    Emulated,
}

/// What a device is, once opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    pub kind: DeviceKind,
    /// The device's ordinal (`CUdevice` for CUDA; chosen by the test for the emulated device).
    pub ordinal: i32,
    pub name: String,
    /// Compute capability (major, minor); the emulated device reports (0, 0).
    pub compute: (i32, i32),
    /// Whether `stream_wait_value` is a device-side wait (`cuStreamWaitValue32`); false where
    /// the device lacks stream memory operations and the backend uses its fallback.
    pub stream_mem_ops: bool,
}

/// What a pointer points to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PtrKind {
    /// Ordinary (pageable) host memory, or an address no allocator of this device knows.
    Host,
    /// Page-locked host memory (`cuMemAllocHost` / `cuMemHostAlloc`, or registered): the copy
    /// engines reach it, so copies from and to it are asynchronous.
    PinnedHost,
    /// Memory of device `ordinal` (`cuMemAlloc`).
    Device { ordinal: i32 },
    /// Managed (unified) memory (`cuMemAllocManaged`), reachable from host and devices.
    Managed,
    /// Device memory this device allocated and has freed since (the emulated device keeps
    /// freed ranges reserved to say so; CUDA reports such an address as `Host`).
    Freed { ordinal: i32 },
}

impl PtrKind {
    /// Whether stream operations (copies, kernels) may use memory of this kind: device or
    /// managed memory, or page-locked host memory.
    pub fn stream_usable(self) -> bool {
        matches!(
            self,
            PtrKind::PinnedHost | PtrKind::Device { .. } | PtrKind::Managed
        )
    }
}

/// A page-locked host allocation: where the host sees it, and where the device does (the same
/// address under CUDA's unified addressing; the backend says).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostAlloc {
    pub host: *mut u8,
    pub device: u64,
    pub len: usize,
}

// SAFETY: a HostAlloc is a description (addresses and a length), not an access; whoever
// dereferences `host` answers for the access.
unsafe impl Send for HostAlloc {}
// SAFETY: as for Send: sharing the description accesses nothing.
unsafe impl Sync for HostAlloc {}

/// A backend's stream handle (`CUstream` as an integer for CUDA; the emulated device's id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawStream(pub u64);

/// A backend's event handle (`CUevent` as an integer for CUDA; the emulated device's id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawEvent(pub u64);

/// A kernel launch: every address is device-visible (device, managed, or the device alias of
/// page-locked host memory) and holds `count` elements of `dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// `dst[i] = a[i] ⊕ b[i]`; `dst` may equal `a` (the in-place form `dst ⊕= b`). Avg reduces
    /// as Sum (see `ScaleAvg`).
    Reduce {
        dtype: DataType,
        op: RedOp,
        dst: u64,
        a: u64,
        b: u64,
        count: usize,
    },
    /// `dst[i] = dst[i] / n`, Avg's last step, as `reduce::scale_avg`.
    ScaleAvg {
        dtype: DataType,
        dst: u64,
        count: usize,
        n: usize,
    },
}

/// One device, as the engines need it. Implemented by `device::cuda` (the driver) and
/// `device::emu` (the emulated device). The handles and addresses a backend returns are only
/// ever passed back to the same backend.
pub trait Backend: Send + Sync + 'static {
    fn info(&self) -> &DeviceInfo;

    /// Makes this device's context current on the calling thread (CUDA: its primary context).
    fn bind(&self) -> Result<()>;
    /// Ok where this device's context is current on the calling thread; otherwise an
    /// `InvalidUsage` error that says to call `Device::bind`, as CUDA fails such a call.
    fn check_current(&self) -> Result<()>;

    /// `len` bytes of device memory (`len > 0`).
    fn alloc(&self, len: usize) -> Result<u64>;
    /// Frees what `alloc` returned.
    ///
    /// # Safety
    /// `addr` and `len` came from `alloc` of this backend, are freed once, and no stream work
    /// that uses the memory is still pending.
    unsafe fn free(&self, addr: u64, len: usize);
    /// `len` bytes of page-locked host memory, mapped for the device (`len > 0`).
    fn alloc_host(&self, len: usize) -> Result<HostAlloc>;
    /// Frees what `alloc_host` returned.
    ///
    /// # Safety
    /// As `free`, for `alloc_host`'s allocation; no host reference to it remains either.
    unsafe fn free_host(&self, alloc: HostAlloc);
    /// What `addr` points to.
    fn classify(&self, addr: u64) -> Result<PtrKind>;

    /// A new stream that does not synchronise with the legacy NULL stream.
    fn stream_create(&self) -> Result<RawStream>;
    /// A caller's stream handle, checked as far as the backend can (the public layer has
    /// already refused the legacy and per-thread default handles).
    ///
    /// # Safety
    /// `handle` is a live stream of this device, and stays so while the result is used.
    unsafe fn stream_adopt(&self, handle: u64) -> Result<RawStream>;
    /// Destroys a stream from `stream_create` (pending work still completes).
    ///
    /// # Safety
    /// `s` came from `stream_create`, is destroyed once and not used afterwards.
    unsafe fn stream_destroy(&self, s: RawStream);
    /// Whether every operation enqueued on `s` so far has completed. An emulated stream that
    /// failed (a flag wait that timed out) reports its error.
    ///
    /// # Safety
    /// `s` is a live stream of this backend.
    unsafe fn stream_query(&self, s: RawStream) -> Result<bool>;

    /// Enqueues a copy of `len` bytes from `src` to `dst` (device-visible addresses).
    ///
    /// # Safety
    /// `s` is live; both ranges are valid, device-visible memory until the copy completes.
    unsafe fn copy(&self, s: RawStream, dst: u64, src: u64, len: usize) -> Result<()>;
    /// Enqueues a kernel.
    ///
    /// # Safety
    /// `s` is live; the kernel's ranges are valid, device-visible memory until it completes.
    unsafe fn launch(&self, s: RawStream, k: &Kernel) -> Result<()>;

    fn event_create(&self) -> Result<RawEvent>;
    /// # Safety
    /// `e` came from `event_create`, is destroyed once and not used afterwards.
    unsafe fn event_destroy(&self, e: RawEvent);
    /// # Safety
    /// `e` and `s` are live.
    unsafe fn event_record(&self, e: RawEvent, s: RawStream) -> Result<()>;
    /// Whether the work before the event's last record has completed. The public layer never
    /// asks about an event it has not recorded.
    ///
    /// # Safety
    /// `e` is live.
    unsafe fn event_query(&self, e: RawEvent) -> Result<bool>;
    /// Makes later work on `s` wait for the event's last record.
    ///
    /// # Safety
    /// `e` and `s` are live.
    unsafe fn stream_wait_event(&self, s: RawStream, e: RawEvent) -> Result<()>;

    /// Makes later work on `s` wait until the 32-bit word at `addr` (device alias of a
    /// page-locked host word) reaches `value`, compared as `(word - value) as i32 >= 0`
    /// (`CU_STREAM_WAIT_VALUE_GEQ`, wrap-around safe). `name` names the flag in errors.
    ///
    /// # Safety
    /// `s` is live; `addr` stays valid page-locked memory until the wait completes.
    unsafe fn stream_wait_value(
        &self,
        s: RawStream,
        addr: u64,
        value: u32,
        name: &str,
    ) -> Result<()>;
    /// Enqueues a write of `value` to the 32-bit word at `addr` (device alias of a page-locked
    /// host word), ordered after the work before it on `s`.
    ///
    /// # Safety
    /// As `stream_wait_value`.
    unsafe fn stream_write_value(&self, s: RawStream, addr: u64, value: u32) -> Result<()>;
}
