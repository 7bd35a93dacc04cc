//! What the plugins may advertise for device memory, decided from plain facts (the provider's
//! capabilities, the libfabric and kernel versions, the device's attributes, the result of a
//! real registration), so that every combination is tested without a GPU.
//!
//! The rules: NCCL_PTR_CUDA only where a device buffer was really registered with the chosen
//! provider (a provider's FI_HMEM bit alone proves nothing: Debian's libfabric 1.17 sets it on
//! shm and still refuses FI_HMEM_CUDA); NCCL_PTR_DMABUF only on top of that, with libfabric's
//! dma-buf registration (1.20), a kernel that imports dma-bufs (5.12) and the device's DMA-BUF
//! attribute, and a dma-buf registration that worked too.

/// The outcome of registering a real device buffer with the provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Registration {
    /// Not attempted, and why (no device, an earlier condition already failed).
    NotTried(String),
    Worked,
    /// The provider refused it: its error.
    Refused(String),
}

/// The facts the decision reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts {
    /// Why CUDA is unusable in this process (`Cuda::why_not`); None when it is up.
    pub cuda_down: Option<String>,
    /// The device has GPUDirect RDMA (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED).
    pub device_gdr: bool,
    pub device_dma_buf: bool,
    /// The provider advertises FI_HMEM.
    pub provider_hmem: bool,
    pub provider: String,
    /// libfabric at run time, (major, minor).
    pub libfabric: (u32, u32),
    /// The running kernel, (major, minor).
    pub kernel: (u32, u32),
    pub registration: Registration,
    pub dmabuf_registration: Registration,
}

/// NCCL's ptrSupport bits and why each missing one is missing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtrSupport {
    /// NCCL_PTR_HOST | NCCL_PTR_CUDA? | NCCL_PTR_DMABUF?
    pub bits: i32,
    pub why_not_cuda: Option<String>,
    pub why_not_dmabuf: Option<String>,
}

pub const PTR_HOST: i32 = 1;
pub const PTR_CUDA: i32 = 2;
pub const PTR_DMABUF: i32 = 4;

/// libfabric gained `FI_MR_DMABUF` in 1.20.
pub const LIBFABRIC_DMABUF: (u32, u32) = (1, 20);
/// Linux imports dma-bufs for RDMA from 5.12 on.
pub const KERNEL_DMABUF: (u32, u32) = (5, 12);

/// Why device memory cannot go to the network directly, or None when it can.
fn why_not_cuda(f: &Facts) -> Option<String> {
    if let Some(why) = &f.cuda_down {
        return Some(format!("CUDA is unusable: {why}"));
    }
    if !f.device_gdr {
        return Some("the device does not support GPUDirect RDMA".into());
    }
    if !f.provider_hmem {
        return Some(format!(
            "provider {} does not offer FI_HMEM (device memory)",
            f.provider
        ));
    }
    match &f.registration {
        Registration::Worked => None,
        Registration::NotTried(why) => Some(format!(
            "no device buffer was registered with {}: {why}",
            f.provider
        )),
        Registration::Refused(err) => Some(format!(
            "{} refused a device buffer (FI_HMEM_CUDA): {err}",
            f.provider
        )),
    }
}

fn why_not_dmabuf(f: &Facts, cuda: bool) -> Option<String> {
    let v = |(a, b): (u32, u32)| format!("{a}.{b}");
    if !cuda {
        return Some("device memory is not supported at all".into());
    }
    if f.libfabric < LIBFABRIC_DMABUF {
        return Some(format!(
            "libfabric {} has no dma-buf registration (needs {})",
            v(f.libfabric),
            v(LIBFABRIC_DMABUF)
        ));
    }
    if f.kernel < KERNEL_DMABUF {
        return Some(format!(
            "kernel {} cannot import dma-bufs (needs {})",
            v(f.kernel),
            v(KERNEL_DMABUF)
        ));
    }
    if !f.device_dma_buf {
        return Some("the device does not export dma-bufs".into());
    }
    match &f.dmabuf_registration {
        Registration::Worked => None,
        Registration::NotTried(why) => Some(format!("no dma-buf was registered: {why}")),
        Registration::Refused(err) => Some(format!(
            "{} refused a dma-buf registration: {err}",
            f.provider
        )),
    }
}

/// ptrSupport for the plugins' device properties.
pub fn ptr_support(f: &Facts) -> PtrSupport {
    let why_not_cuda = why_not_cuda(f);
    let cuda = why_not_cuda.is_none();
    let why_not_dmabuf = why_not_dmabuf(f, cuda);
    let mut bits = PTR_HOST;
    if cuda {
        bits |= PTR_CUDA;
    }
    if why_not_dmabuf.is_none() {
        bits |= PTR_DMABUF;
    }
    PtrSupport {
        bits,
        why_not_cuda,
        why_not_dmabuf,
    }
}

/// How `iflush` makes the network's writes into device memory visible to the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flush {
    /// Nothing to flush: received data lands in host memory.
    None,
    /// `cuFlushGPUDirectRDMAWrites(TARGET_CURRENT_CTX, TO_OWNER)`.
    Driver,
    /// A read of a device sentinel through the NIC, which orders after the earlier writes.
    SentinelRead,
}

/// CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST: the flush call is available from the host.
pub const FLUSH_OPTION_HOST: i32 = 1;

/// The flush method for a receive into memory of this kind.
pub fn flush_method(ptr_bits: i32, device_gdr: bool, flush_options: i32) -> Flush {
    if ptr_bits & PTR_CUDA == 0 {
        Flush::None
    } else if device_gdr && flush_options & FLUSH_OPTION_HOST != 0 {
        Flush::Driver
    } else {
        Flush::SentinelRead
    }
}

/// "major.minor" of a release string such as "6.1.0-18-amd64"; (0, 0) if it has none.
pub fn parse_release(s: &str) -> (u32, u32) {
    let mut it = s
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    match (it.next(), it.next()) {
        (Some(a), Some(b)) => (a, b),
        _ => (0, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Facts {
        Facts {
            cuda_down: None,
            device_gdr: true,
            device_dma_buf: true,
            provider_hmem: true,
            provider: "efa".into(),
            libfabric: (1, 22),
            kernel: (6, 1),
            registration: Registration::Worked,
            dmabuf_registration: Registration::Worked,
        }
    }

    #[test]
    fn every_combination() {
        let regs = [
            Registration::Worked,
            Registration::NotTried("no device".into()),
            Registration::Refused("-38".into()),
        ];
        let mut n = 0;
        for down in [None, Some("no driver".to_string())] {
            for gdr in [false, true] {
                for dmab in [false, true] {
                    for hmem in [false, true] {
                        for lf in [(1, 17), (1, 20)] {
                            for kernel in [(5, 10), (5, 12)] {
                                for reg in &regs {
                                    for dreg in &regs {
                                        let f = Facts {
                                            cuda_down: down.clone(),
                                            device_gdr: gdr,
                                            device_dma_buf: dmab,
                                            provider_hmem: hmem,
                                            provider: "p".into(),
                                            libfabric: lf,
                                            kernel,
                                            registration: reg.clone(),
                                            dmabuf_registration: dreg.clone(),
                                        };
                                        let p = ptr_support(&f);
                                        let cuda = down.is_none()
                                            && gdr
                                            && hmem
                                            && *reg == Registration::Worked;
                                        let dmabuf = cuda
                                            && dmab
                                            && lf >= (1, 20)
                                            && kernel >= (5, 12)
                                            && *dreg == Registration::Worked;
                                        assert_eq!(p.bits & PTR_HOST, PTR_HOST, "{f:?}");
                                        assert_eq!(p.bits & PTR_CUDA != 0, cuda, "{f:?}");
                                        assert_eq!(p.bits & PTR_DMABUF != 0, dmabuf, "{f:?}");
                                        assert_eq!(p.why_not_cuda.is_none(), cuda, "{f:?}");
                                        assert_eq!(p.why_not_dmabuf.is_none(), dmabuf, "{f:?}");
                                        n += 1;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(n, 2 * 2 * 2 * 2 * 2 * 2 * 3 * 3);
    }

    #[test]
    fn reasons_name_the_first_missing_condition() {
        let mut f = base();
        assert_eq!(ptr_support(&f).bits, PTR_HOST | PTR_CUDA | PTR_DMABUF);
        f.libfabric = (1, 17);
        let p = ptr_support(&f);
        assert_eq!(p.bits, PTR_HOST | PTR_CUDA);
        assert!(p.why_not_dmabuf.unwrap().contains("libfabric 1.17"));
        // Debian's shm: FI_HMEM advertised, the registration refused.
        f.provider = "shm".into();
        f.registration = Registration::Refused("Function not implemented (-38)".into());
        let p = ptr_support(&f);
        assert_eq!(p.bits, PTR_HOST);
        let why = p.why_not_cuda.unwrap();
        assert!(why.contains("shm refused") && why.contains("-38"), "{why}");
        f.cuda_down = Some("libcuda.so was not found".into());
        let why = ptr_support(&f).why_not_cuda.unwrap();
        assert!(why.starts_with("CUDA is unusable: libcuda.so"), "{why}");
    }

    #[test]
    fn flush_methods() {
        assert_eq!(flush_method(PTR_HOST, true, 1), Flush::None);
        assert_eq!(flush_method(PTR_HOST | PTR_CUDA, true, 1), Flush::Driver);
        assert_eq!(
            flush_method(PTR_HOST | PTR_CUDA, true, 2),
            Flush::SentinelRead
        );
        assert_eq!(
            flush_method(PTR_HOST | PTR_CUDA, false, 1),
            Flush::SentinelRead
        );
        assert_eq!(
            flush_method(PTR_HOST | PTR_CUDA, true, 0),
            Flush::SentinelRead
        );
    }

    #[test]
    fn releases() {
        assert_eq!(parse_release("6.1.0-18-amd64"), (6, 1));
        assert_eq!(parse_release("5.12"), (5, 12));
        assert_eq!(parse_release("6.18.44-fc-v657"), (6, 18));
        assert_eq!(parse_release("weird"), (0, 0));
        assert_eq!(parse_release("7"), (0, 0));
    }
}
