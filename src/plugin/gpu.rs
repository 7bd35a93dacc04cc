//! Device memory in the net plugin: whether a device takes it (`ptr_support`, from a real
//! registration of a device buffer with the provider), what a buffer NCCL registers as
//! NCCL_PTR_CUDA is (`device_of`, the device seam's classification), and how `iflush` makes
//! received data visible to the GPU (`flush`). The decisions themselves are `cuda::caps`, pure
//! and tested without a GPU; `ordinal_on` and `Sentinel` take any seam device, so CI runs them
//! on the emulated one.
use super::{Flavour, NCCL_PTR_CUDA, NCCL_PTR_HOST};
use crate::cuda::{self, caps, Register};
use crate::device::{Device, HostBuffer, PtrKind, Span, Stream};
use crate::error::{Error, Result};
use crate::transport::{Caps, Region};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// How long `iflush`'s sentinel read may take.
pub const SENTINEL_DEADLINE: Duration = Duration::from_secs(10);

/// NCCL_PTR_HOST, with device memory only where `cuda::caps` finds that the provider really
/// takes it: `register` registers a device buffer with the provider, tried once per device
/// where every other condition holds (Neuron's runtime passes no CUDA memory: never tried).
/// Why not is logged, one line per device. The decision reads CUDA device 0: NCCL asks before
/// it says which GPU a comm will serve.
pub fn ptr_support(flavour: Flavour, caps: &Caps, dev: usize, register: Register) -> i32 {
    if flavour != Flavour::Nccl {
        return NCCL_PTR_HOST;
    }
    let p = caps::ptr_support(&cuda::facts(caps, 0, Some(register)));
    match &p.why_not_cuda {
        Some(why) => log::info!(
            "device {dev} ({}): ptrSupport NCCL_PTR_HOST only: {why}",
            caps.domain
        ),
        None => log::info!(
            "device {dev} ({}): ptrSupport {:#x}: {} took a CUDA device buffer{}",
            caps.domain,
            p.bits,
            caps.provider,
            p.why_not_dmabuf
                .as_deref()
                .map(|w| format!("; no NCCL_PTR_DMABUF: {w}"))
                .unwrap_or_default()
        ),
    }
    p.bits
}

/// What `regMr` registers for a buffer of NCCL type `ptr_type` on a device with `ptr_support`:
/// host memory, or the memory of a CUDA device (its ordinal, from `ordinal_of`). An error
/// where the type is unknown or the device does not take it.
pub fn memory_kind(
    ptr_type: i32,
    ptr_support: i32,
    ordinal_of: impl FnOnce() -> Result<i32>,
) -> Result<Option<i32>> {
    match ptr_type {
        NCCL_PTR_HOST => Ok(None),
        NCCL_PTR_CUDA if ptr_support & NCCL_PTR_CUDA != 0 => ordinal_of().map(Some),
        NCCL_PTR_CUDA => Err(Error::arg(
            "type",
            format!(
                "NCCL_PTR_CUDA: this device takes host memory only (ptrSupport {ptr_support:#x}; \
                 the log says why)"
            ),
        )),
        t => Err(Error::arg(
            "type",
            format!("{t} is neither NCCL_PTR_HOST (1) nor NCCL_PTR_CUDA (2)"),
        )),
    }
}

/// A CUDA device opened through the seam, and the sentinel its flushes read into.
type Opened = (Device, Arc<Sentinel>);

/// CUDA device `ordinal` through the device seam, opened once per process and kept, with the
/// sentinel its flushes read into.
fn seam(ordinal: i32) -> Result<Opened> {
    static OPEN: Mutex<Option<HashMap<i32, Opened>>> = Mutex::new(None);
    let mut g = OPEN.lock();
    let map = g.get_or_insert_with(HashMap::new);
    if let Some((d, s)) = map.get(&ordinal) {
        return Ok((d.clone(), s.clone()));
    }
    let d = Device::cuda(ordinal)?;
    let s = Arc::new(cuda::mem::keeping_context(|| Sentinel::new(&d))?);
    map.insert(ordinal, (d.clone(), s.clone()));
    Ok((d, s))
}

/// Make ready what flushes into device `ordinal`'s memory need. regMr calls it for device
/// buffers, before NCCL's kernels wait on any flush; a flush that finds nothing ready makes
/// it then.
pub fn prepare_flush(ordinal: i32) -> Result<()> {
    seam(ordinal).map(drop)
}

/// The CUDA device whose memory `region` is (classified in device 0's context: addresses are
/// unified across devices).
pub fn device_of(region: &Region) -> Result<i32> {
    cuda::mem::keeping_context(|| ordinal_on(&seam(0)?.0, region))
}

/// The device whose memory `region` is, as `dev` classifies it; an error naming what it is
/// where it is not device memory.
pub fn ordinal_on(dev: &Device, region: &Region) -> Result<i32> {
    dev.bind()?;
    let at = region.addr();
    match dev.classify(at as *const std::ffi::c_void)? {
        PtrKind::Device { ordinal } => Ok(ordinal),
        PtrKind::Freed { ordinal } => Err(Error::arg(
            "data",
            format!("{at:#x} is memory of device {ordinal} that was freed"),
        )),
        other => Err(Error::arg(
            "data",
            format!("{at:#x} is {other:?} memory, not device memory (NCCL_PTR_CUDA)"),
        )),
    }
}

/// What a sentinel read needs, made once per device: a stream of our own and a page-locked
/// word to read into. Allocating page-locked memory waits for every stream of the device (the
/// driver synchronises), and when NCCL flushes, its kernel may be waiting for the flush: an
/// allocation per flush could wait for a kernel that waits for it.
pub struct Sentinel {
    stream: Stream,
    word: HostBuffer,
    /// One read at a time: they share the word.
    busy: Mutex<()>,
}

impl Sentinel {
    /// The stream and word for flushes into `dev`'s memory.
    pub fn new(dev: &Device) -> Result<Sentinel> {
        dev.bind()?;
        Ok(Sentinel {
            stream: dev.create_stream()?,
            word: dev.alloc_host(4)?,
            busy: Mutex::new(()),
        })
    }

    /// Read the first word of `region` (device memory of `dev`, the device this sentinel was
    /// made on) into the page-locked word, to `timeout`: the read is ordered after the writes
    /// that landed before. Allocates nothing.
    pub fn read(&self, dev: &Device, region: &Region, timeout: Duration) -> Result<()> {
        dev.bind()?;
        let _one = self.busy.lock();
        // SAFETY: `region` is device memory of at least 4 bytes that stays allocated while its
        // receive is being flushed (the caller's), and the copy is waited for below.
        let src = unsafe { Span::from_raw(dev, region.addr() as u64, 4, "data") }?;
        self.stream.copy(&self.word.span(), &src)?;
        self.stream.synchronize(timeout)
    }
}

/// `iflush` of a receive into `region` (device `ordinal`'s memory) with `method`.
pub fn flush(method: caps::Flush, ordinal: i32, region: &Region) -> Result<()> {
    match method {
        caps::Flush::None => Ok(()),
        caps::Flush::Driver => cuda::mem::flush_writes(ordinal),
        caps::Flush::SentinelRead if region.len() >= 4 => cuda::mem::keeping_context(|| {
            let (dev, sentinel) = seam(ordinal)?;
            sentinel.read(&dev, region, SENTINEL_DEADLINE)
        }),
        // Nothing landed to order against.
        caps::Flush::SentinelRead => Ok(()),
    }
}

/// How this process flushes receives into device `ordinal`'s memory on a device with
/// `ptr_support` (`caps::flush_method` on the device's attributes).
pub fn flush_method(ptr_support: i32, ordinal: i32) -> caps::Flush {
    let dev = cuda::probe()
        .driver()
        .and_then(|d| d.devices.iter().find(|d| d.ordinal == ordinal).cloned())
        .unwrap_or_default();
    caps::flush_method(ptr_support, dev.gdr, dev.flush_options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_kinds_for_every_type_and_support() {
        let host_only = NCCL_PTR_HOST;
        let cuda = NCCL_PTR_HOST | NCCL_PTR_CUDA;
        let never = || -> Result<i32> { panic!("a host buffer is never classified") };
        assert_eq!(memory_kind(NCCL_PTR_HOST, host_only, never).unwrap(), None);
        assert_eq!(memory_kind(NCCL_PTR_HOST, cuda, never).unwrap(), None);
        assert_eq!(memory_kind(NCCL_PTR_CUDA, cuda, || Ok(3)).unwrap(), Some(3));
        // The classification's error is regMr's.
        let e = memory_kind(NCCL_PTR_CUDA, cuda, || {
            Err(Error::arg("data", "host memory"))
        });
        assert!(e.unwrap_err().to_string().contains("host memory"));
        let e = memory_kind(NCCL_PTR_CUDA, host_only, never).unwrap_err();
        assert!(e.to_string().contains("host memory only"), "{e}");
        for t in [0, 4, 3, -1] {
            let e = memory_kind(t, cuda, never).unwrap_err();
            assert!(e.to_string().contains("neither"), "{e}");
        }
    }
}
