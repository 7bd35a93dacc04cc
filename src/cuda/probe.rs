//! The one cached probe of the CUDA driver and its devices.
use cudarc::driver::{result, sys};
use std::sync::OnceLock;

/// What the CUDA driver offers this process.
#[derive(Clone, Debug)]
pub enum Cuda {
    /// No driver library: a machine without an NVIDIA driver.
    Absent {
        why: String,
    },
    /// The driver library is there but cannot be used (no device, driver too old, broken).
    Unusable {
        why: String,
    },
    Up(Driver),
}

/// A usable driver and its devices.
#[derive(Clone, Debug)]
pub struct Driver {
    /// `cuDriverGetVersion`: 1000 x major + 10 x minor (12080 = 12.8).
    pub version: i32,
    pub devices: Vec<Device>,
}

/// One device and the attributes that decide how the network may reach its memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Device {
    pub ordinal: i32,
    pub name: String,
    pub compute: (i32, i32),
    /// CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: a NIC may read and write its memory.
    pub gdr: bool,
    /// ..._GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: also for cuMemCreate allocations.
    pub gdr_vmm: bool,
    /// ..._GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS: bit 0 = `cuFlushGPUDirectRDMAWrites` works.
    pub flush_options: i32,
    /// ..._GPU_DIRECT_RDMA_WRITES_ORDERING: 0 none, 100 owner, 200 all devices.
    pub writes_ordering: i32,
    /// ..._DMA_BUF_SUPPORTED: device memory can be exported as a dma-buf.
    pub dma_buf: bool,
    /// Attributes the driver would not report (older drivers lack some); those read as 0.
    pub unknown: Vec<&'static str>,
}

impl Cuda {
    /// The driver and devices, where usable.
    pub fn driver(&self) -> Option<&Driver> {
        match self {
            Cuda::Up(d) => Some(d),
            _ => None,
        }
    }

    /// Why CUDA cannot be used, where it cannot.
    pub fn why_not(&self) -> Option<&str> {
        match self {
            Cuda::Absent { why } | Cuda::Unusable { why } => Some(why),
            Cuda::Up(_) => None,
        }
    }
}

/// The probe, run once per process: find libcuda, `cuInit`, read every device.
pub fn probe() -> &'static Cuda {
    static PROBE: OnceLock<Cuda> = OnceLock::new();
    PROBE.get_or_init(run)
}

fn run() -> Cuda {
    // SAFETY: is_culib_present only tries to dlopen the driver library's usual names and closes
    // what it opened; it touches no cudarc state and calls no CUDA function.
    if !unsafe { sys::is_culib_present() } {
        return Cuda::Absent {
            why: "libcuda.so (the NVIDIA driver library) was not found".into(),
        };
    }
    // cudarc panics where the driver lacks a function it resolves: a guard, not a path taken
    // on a working driver.
    match std::panic::catch_unwind(up) {
        Ok(c) => c,
        Err(_) => Cuda::Unusable {
            why: "the CUDA driver lacks a function this build calls (too old a driver?)".into(),
        },
    }
}

fn up() -> Cuda {
    if let Err(e) = result::init() {
        return Cuda::Unusable {
            why: format!("cuInit failed: {}", name(&e)),
        };
    }
    let mut version = 0;
    // SAFETY: the driver is initialised and `version` is a valid place for one int.
    if let Err(e) = unsafe { sys::cuDriverGetVersion(&mut version) }.result() {
        return Cuda::Unusable {
            why: format!("cuDriverGetVersion failed: {}", name(&e)),
        };
    }
    let count = match result::device::get_count() {
        Ok(n) => n,
        Err(e) => {
            return Cuda::Unusable {
                why: format!("cuDeviceGetCount failed: {}", name(&e)),
            }
        }
    };
    if count < 1 {
        return Cuda::Unusable {
            why: format!("driver {} reports no device", version_string(version)),
        };
    }
    let mut devices = Vec::new();
    for ordinal in 0..count {
        match device(ordinal) {
            Ok(d) => devices.push(d),
            Err(e) => {
                return Cuda::Unusable {
                    why: format!("device {ordinal}: {}", name(&e)),
                }
            }
        }
    }
    Cuda::Up(Driver { version, devices })
}

fn device(ordinal: i32) -> Result<Device, result::DriverError> {
    use sys::CUdevice_attribute as A;
    let dev = result::device::get(ordinal)?;
    let mut d = Device {
        ordinal,
        name: result::device::get_name(dev)?,
        ..Device::default()
    };
    let mut attr = |a: A, what: &'static str| {
        // SAFETY: `dev` came from cuDeviceGet on an initialised driver.
        match unsafe { result::device::get_attribute(dev, a) } {
            Ok(v) => v,
            Err(_) => {
                d.unknown.push(what);
                0
            }
        }
    };
    let major = attr(
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        "compute major",
    );
    let minor = attr(
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        "compute minor",
    );
    let gdr = attr(
        A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED,
        "GPUDirect RDMA",
    );
    let gdr_vmm = attr(
        A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
        "GPUDirect RDMA with VMM",
    );
    let flush = attr(
        A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS,
        "flush options",
    );
    let ordering = attr(
        A::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING,
        "writes ordering",
    );
    let dma_buf = attr(A::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, "DMA-BUF");
    d.compute = (major, minor);
    d.gdr = gdr != 0;
    d.gdr_vmm = gdr_vmm != 0;
    d.flush_options = flush;
    d.writes_ordering = ordering;
    d.dma_buf = dma_buf != 0;
    Ok(d)
}

/// "12.8" from 12080.
pub fn version_string(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

fn name(e: &result::DriverError) -> String {
    match e.error_name() {
        Ok(n) => format!("{} ({})", n.to_string_lossy(), e.0 as i32),
        Err(_) => format!("CUresult {}", e.0 as i32),
    }
}
