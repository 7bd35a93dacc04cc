//! Device memory and page-locked host memory: the owning buffers (`DeviceBuffer`,
//! `HostBuffer`), whose Drop frees, and `Span`, the range of memory a stream operation uses.
//!
//! Freeing while a stream still uses the memory cannot happen from safe code: a span taken from
//! a buffer holds the allocation alive, and a stream keeps the spans of its pending operations
//! until it has seen them complete. Dropping a buffer whose memory a stream still uses
//! therefore frees it only when that work is done. A span made from a raw address
//! (`Span::from_raw`, unsafe) holds nothing alive: the caller promises the memory outlives the
//! work, as CUDA's own API asks.
use std::ops::Range;
use std::sync::Arc;

use super::backend::{HostAlloc, PtrKind};
use super::Device;
use crate::{Error, Result};

/// One allocation of a backend; freed when the last holder (buffer, span, stream) lets go.
pub(crate) struct Alloc {
    dev: Device,
    what: What,
}

enum What {
    Device { addr: u64, len: usize },
    Host(HostAlloc),
}

impl Drop for Alloc {
    fn drop(&mut self) {
        match self.what {
            // SAFETY: the allocation came from this backend and is freed once (here, by its
            // last holder); every stream that used it held it until the work completed.
            What::Device { addr, len } => unsafe { self.dev.backend().free(addr, len) },
            // SAFETY: as above; host references borrow a HostBuffer, which holds this alive.
            What::Host(h) => unsafe { self.dev.backend().free_host(h) },
        }
    }
}

/// A range of device-visible memory for stream operations: device or managed memory, or
/// page-locked host memory (then `addr` is its device-visible address, which under CUDA's
/// unified addressing and on the emulated device is also its host address).
#[derive(Clone)]
pub struct Span {
    addr: u64,
    len: usize,
    kind: PtrKind,
    /// The allocation this span lies in, when it came from a buffer: held alive by the span
    /// and by any stream work that uses it.
    owner: Option<Arc<Alloc>>,
}

impl std::fmt::Debug for Span {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Span({:#x}, {} bytes, {:?})",
            self.addr, self.len, self.kind
        )
    }
}

impl Span {
    /// A span over memory this library did not allocate (a caller's device pointer), after
    /// classifying it on `dev`: device, managed or page-locked host memory is accepted;
    /// pageable host memory and freed device memory are an `InvalidArgument` naming `arg`.
    ///
    /// # Safety
    /// `[addr, addr + len)` is valid memory of the kind classified, and stays valid until
    /// every stream operation given this span (or a part of it) has completed.
    pub unsafe fn from_raw(dev: &Device, addr: u64, len: usize, arg: &str) -> Result<Span> {
        dev.check_current()?;
        if addr == 0 {
            return Err(Error::arg(arg, "null pointer"));
        }
        let kind = dev.backend().classify(addr)?;
        match kind {
            PtrKind::Host => Err(Error::arg(
                arg,
                format!(
                    "{addr:#x} is pageable host memory, not device memory: stream operations \
                     need device, managed or page-locked host memory"
                ),
            )),
            PtrKind::Freed { ordinal } => Err(Error::arg(
                arg,
                format!("{addr:#x} is device memory of device {ordinal} that was freed"),
            )),
            PtrKind::Device { ordinal } if ordinal != dev.ordinal() => Err(Error::arg(
                arg,
                format!(
                    "{addr:#x} is memory of device {ordinal}, not of device {}",
                    dev.ordinal()
                ),
            )),
            _ => Ok(Span {
                addr,
                len,
                kind,
                owner: None,
            }),
        }
    }

    /// The device-visible address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The allocation the span lies in, if it came from a buffer.
    pub(crate) fn owner(&self) -> Option<Arc<Alloc>> {
        self.owner.clone()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn kind(&self) -> PtrKind {
        self.kind
    }

    /// The bytes `range` of this span (same owner). A range outside it is an
    /// `InvalidArgument` naming `range`.
    pub fn slice(&self, range: Range<usize>) -> Result<Span> {
        if range.start > range.end || range.end > self.len {
            return Err(Error::arg(
                "range",
                format!("{range:?} is outside a span of {} bytes", self.len),
            ));
        }
        Ok(Span {
            addr: self.addr + range.start as u64,
            len: range.end - range.start,
            kind: self.kind,
            owner: self.owner.clone(),
        })
    }
}

/// Device memory of one device; freed on Drop, or later if a stream still uses it.
pub struct DeviceBuffer {
    span: Span,
}

impl DeviceBuffer {
    pub(crate) fn new(dev: &Device, len: usize) -> Result<DeviceBuffer> {
        dev.check_current()?;
        if len == 0 {
            return Err(Error::arg("len", "a device buffer needs at least one byte"));
        }
        let addr = dev.backend().alloc(len)?;
        let owner = Arc::new(Alloc {
            dev: dev.clone(),
            what: What::Device { addr, len },
        });
        Ok(DeviceBuffer {
            span: Span {
                addr,
                len,
                kind: PtrKind::Device {
                    ordinal: dev.ordinal(),
                },
                owner: Some(owner),
            },
        })
    }

    /// The device address (`CUdeviceptr`).
    pub fn addr(&self) -> u64 {
        self.span.addr
    }

    pub fn len(&self) -> usize {
        self.span.len
    }

    pub fn is_empty(&self) -> bool {
        self.span.len == 0
    }

    /// The whole buffer as a span for stream operations.
    pub fn span(&self) -> Span {
        self.span.clone()
    }

    /// Bytes `range` as a span.
    pub fn slice(&self, range: Range<usize>) -> Result<Span> {
        self.span.slice(range)
    }
}

/// Page-locked host memory mapped for the device (so copies to and from it are asynchronous
/// and the device can read and write it); freed on Drop, or later if a stream still uses it.
pub struct HostBuffer {
    span: Span,
    host: *mut u8,
}

// SAFETY: the buffer owns its memory (through `span`'s allocation); host access goes through
// `&self`/`&mut self` methods that check no one else holds it, or through unsafe ones.
unsafe impl Send for HostBuffer {}
// SAFETY: shared references give only unsafe or checked access.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    pub(crate) fn new(dev: &Device, len: usize) -> Result<HostBuffer> {
        dev.check_current()?;
        if len == 0 {
            return Err(Error::arg("len", "a host buffer needs at least one byte"));
        }
        let h = dev.backend().alloc_host(len)?;
        let owner = Arc::new(Alloc {
            dev: dev.clone(),
            what: What::Host(h),
        });
        Ok(HostBuffer {
            span: Span {
                addr: h.device,
                len,
                kind: PtrKind::PinnedHost,
                owner: Some(owner),
            },
            host: h.host,
        })
    }

    pub fn len(&self) -> usize {
        self.span.len
    }

    pub fn is_empty(&self) -> bool {
        self.span.len == 0
    }

    /// The host address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.host
    }

    /// The whole buffer as a span for stream operations.
    pub fn span(&self) -> Span {
        self.span.clone()
    }

    /// Bytes `range` as a span.
    pub fn slice(&self, range: Range<usize>) -> Result<Span> {
        self.span.slice(range)
    }

    /// Whether no span of this buffer exists and no stream holds it (pending work, or done
    /// work the stream has not yet seen complete: query or synchronize it).
    pub fn is_idle(&mut self) -> bool {
        self.span
            .owner
            .as_mut()
            .is_some_and(|o| Arc::get_mut(o).is_some())
    }

    /// The bytes, for the host, while nothing else can reach them: no span of the buffer
    /// exists and no stream holds it. Otherwise `InvalidUsage`, since a stream could be writing
    /// them.
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8]> {
        if !self.is_idle() {
            return Err(Error::InvalidUsage(
                "host buffer: a span of it exists or a stream still holds it (query or \
                 synchronize the stream, and drop the spans, before touching it from the host)"
                    .into(),
            ));
        }
        // SAFETY: the allocation is `len` bytes of host memory, alive while self is; nothing
        // else holds it (checked above), and `&mut self` keeps anyone from taking a span for
        // as long as the slice lives.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.host, self.span.len) })
    }

    /// The bytes, for the host, without the check of `as_mut_slice`.
    ///
    /// # Safety
    /// No stream operation writes the buffer while the slice lives.
    pub unsafe fn as_slice_unchecked(&self) -> &[u8] {
        // SAFETY: `len` bytes of host memory alive while self is; the caller excludes writers.
        unsafe { std::slice::from_raw_parts(self.host, self.span.len) }
    }

    /// The bytes, for the host to write, without the check of `as_mut_slice`.
    ///
    /// # Safety
    /// No stream operation reads or writes the buffer, and no other reference to it exists,
    /// while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice_unchecked(&self) -> &mut [u8] {
        // SAFETY: `len` bytes of host memory alive while self is; the caller excludes others.
        unsafe { std::slice::from_raw_parts_mut(self.host, self.span.len) }
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer({:#x}, {} bytes)",
            self.span.addr, self.span.len
        )
    }
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostBuffer({:?}, {} bytes)", self.host, self.span.len)
    }
}
