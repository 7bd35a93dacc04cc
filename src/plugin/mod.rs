//! NCCL semantics, independent of the ABI version: devices and their properties, handles,
//! listen/connect/accept state machines, requests, multi-request groups and the registration
//! cache.
pub mod collnet;
pub mod collnet_device;
pub mod gpu;
pub mod handles;
pub mod mr;
pub mod multi;
pub mod net;
pub mod tuner;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::transport::fabric::{self, FabricTransport};
use crate::transport::loopback::LoopbackFabric;
use crate::transport::Transport;
use net::Device;
use once_cell::sync::OnceCell;
use std::ffi::CString;
use std::sync::Arc;

/// Largest `n` of a grouped receive.
pub const MAX_RECVS: usize = 8;
/// Size of a connection handle (NCCL_NET_HANDLE_MAXSIZE).
pub const HANDLE_SIZE: usize = 128;
/// Largest single transfer. NCCL's own chunks are at most 1 GiB, and `test` reports sizes as int.
pub const MAX_P2P_BYTES: usize = 1 << 30;
/// Largest CollNet operation (NCCL's MAX_COLLNET_SIZE).
pub const MAX_COLL_BYTES: usize = 512 << 20;
/// Comms per device we promise (wire ids have 22 bits; this leaves room for reuse delay).
pub const MAX_COMMS: i32 = 65536;
/// `ptrSupport` bit for host memory.
pub const NCCL_PTR_HOST: i32 = 1;
/// `ptrSupport` bit for CUDA memory.
pub const NCCL_PTR_CUDA: i32 = 2;
/// `ptrSupport` bit for Neuron device memory (Neuron's ABI; NVIDIA's DMABUF bit has this value).
pub const NCCL_PTR_NEURON: i32 = 4;

/// Which runtime loads the plugin. The semantics are NCCL's for both; Neuron's libnccom differs in
/// what it expects of registrations: it keeps its own cache and registers sub-page buffers, and
/// it may write and read peers' registered memory (RMA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavour {
    Nccl,
    Neuron,
}

impl Flavour {
    /// Whether registrations are cached and page-rounded (`FABRICOLL_MR_CACHE` overrides): yes
    /// for NCCL (which makes `regIsGlobal` true); no for Neuron, whose runtime caches itself and
    /// wants each registration exactly as asked.
    pub fn mr_cache(self, cfg: &Config) -> bool {
        cfg.mr_cache.unwrap_or(self == Flavour::Nccl)
    }
}

/// Properties of a device, version-neutral; the ffi layer writes them into each ABI's struct.
#[derive(Debug, Clone)]
pub struct DeviceProps {
    /// The device's index (its own vNIC child in `vProps`).
    pub index: usize,
    pub name: CString,
    pub pci_path: Option<CString>,
    pub guid: u64,
    pub ptr_support: i32,
    pub reg_is_global: bool,
    pub speed_mbps: i32,
    pub port: i32,
    pub latency_us: f32,
    pub max_comms: i32,
    pub max_recvs: i32,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    /// Remote memory access, where the provider offers it with virtual addresses (Neuron only).
    pub rma: Option<RmaProps>,
    /// The provider's `mr_key_size`.
    pub mr_key_size: usize,
}

/// What `iwrite` / `iread` can do on a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RmaProps {
    /// Largest `iwriteInline` (the provider's RMA inject size).
    pub inline_bytes: usize,
}

/// Kinds of objects handed to NCCL as opaque pointers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Listen = 1,
    Send = 2,
    Recv = 3,
    Mr = 4,
    Request = 5,
    Pending = 6,
    Ctx = 7,
    CollListen = 8,
    CollComm = 9,
    CollRequest = 10,
    CollMr = 11,
}

/// The low 8 bits of a plugin handle: the device index and the kind.
pub fn handle_tag(dev: usize, kind: Kind) -> u8 {
    ((dev as u8 & 0xf) << 4) | kind as u8
}

/// A new handle (see [`handles`]): a never-reused serial, the device index and the kind.
pub fn new_handle(dev: usize, kind: Kind) -> u64 {
    handles::new_key(handle_tag(dev, kind))
}

pub fn handle_dev(h: u64) -> usize {
    ((h >> 4) & 0xf) as usize
}

pub fn handle_kind(h: u64) -> u8 {
    (h & 0xf) as u8
}

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for p in parts {
        for b in p.iter().chain(std::iter::once(&0u8)) {
            h ^= *b as u64;
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    h
}

/// The plugin: its devices and what discovery saw.
pub struct Plugin {
    pub flavour: Flavour,
    pub devices: Vec<Device>,
    pub provider: String,
    pub providers: Vec<String>,
}

impl Plugin {
    /// Devices from libfabric discovery, as the configuration asks (NCCL's flavour).
    pub fn discover(cfg: &Config) -> Result<Plugin> {
        Plugin::discover_as(cfg, Flavour::Nccl)
    }

    /// Devices from libfabric discovery, for the runtime `flavour`.
    pub fn discover_as(cfg: &Config, flavour: Flavour) -> Result<Plugin> {
        let disc = fabric::discover(cfg, fabric::Use::Plugin)?;
        let Some(provider) = disc.chosen.clone() else {
            return Err(Error::System(format!(
                "no usable libfabric provider (wanted {}; found: {})",
                cfg.provider.as_deref().unwrap_or("efa, tcp or shm"),
                if disc.providers.is_empty() {
                    "none".to_string()
                } else {
                    disc.providers.join(", ")
                }
            )));
        };
        let mut devices = Vec::new();
        for (i, d) in disc.devices.into_iter().enumerate().take(16) {
            let caps = d.caps.clone();
            let pci = d.pci_path.clone();
            let dev = Arc::new(d);
            // The probe's endpoint and registration go before the device's own is opened.
            let ptr_support = gpu::ptr_support(flavour, &caps, i, &|r, o, dmabuf| {
                let t = FabricTransport::open(&dev)?;
                match dmabuf {
                    Some(b) => t.register_dmabuf(r, o, b).map(drop),
                    None => t.register_device(r, o).map(drop),
                }
            });
            let props = DeviceProps {
                index: i,
                name: CString::new(caps.domain.clone()).unwrap_or_default(),
                pci_path: pci.as_deref().and_then(|p| CString::new(p).ok()),
                guid: fnv1a(&[
                    caps.provider.as_bytes(),
                    caps.domain.as_bytes(),
                    pci.as_deref().unwrap_or("").as_bytes(),
                ]),
                ptr_support,
                reg_is_global: flavour.mr_cache(cfg),
                speed_mbps: dev
                    .speed_mbps
                    .unwrap_or(cfg.speed_mbps as u64)
                    .min(i32::MAX as u64) as i32,
                port: 0,
                latency_us: caps.latency_us,
                max_comms: MAX_COMMS,
                max_recvs: MAX_RECVS as i32,
                max_p2p_bytes: MAX_P2P_BYTES.min(caps.max_msg_size),
                max_coll_bytes: MAX_COLL_BYTES.min(caps.max_msg_size),
                rma: rma_props(flavour, &caps),
                mr_key_size: caps.rma_caps.as_ref().map_or(0, |r| r.key_size),
            };
            let open = move || -> Result<Arc<dyn Transport>> {
                Ok(Arc::new(FabricTransport::open(&dev)?))
            };
            devices.push(Device::new(i, props, cfg, flavour, Box::new(open)));
        }
        if devices.is_empty() {
            return Err(Error::System(format!(
                "libfabric provider {provider} has no usable domain"
            )));
        }
        Ok(Plugin {
            flavour,
            devices,
            provider,
            providers: disc.providers,
        })
    }

    /// `ndev` devices on an in-process fabric (tests), NCCL's flavour.
    pub fn loopback(fabric: &Arc<LoopbackFabric>, ndev: usize, cfg: &Config) -> Plugin {
        Plugin::loopback_as(fabric, ndev, cfg, Flavour::Nccl)
    }

    /// `ndev` devices on an in-process fabric (tests), for the runtime `flavour`.
    pub fn loopback_as(
        fabric: &Arc<LoopbackFabric>,
        ndev: usize,
        cfg: &Config,
        flavour: Flavour,
    ) -> Plugin {
        // What an endpoint of this fabric offers (every one offers the same).
        let caps = fabric.endpoint().caps().clone();
        let devices = (0..ndev)
            .map(|i| {
                let props = DeviceProps {
                    index: i,
                    name: CString::new(format!("loopback{i}")).unwrap_or_default(),
                    pci_path: None,
                    guid: i as u64 + 1,
                    ptr_support: NCCL_PTR_HOST,
                    reg_is_global: flavour.mr_cache(cfg),
                    speed_mbps: cfg.speed_mbps as i32,
                    port: 0,
                    latency_us: caps.latency_us,
                    max_comms: MAX_COMMS,
                    max_recvs: MAX_RECVS as i32,
                    max_p2p_bytes: MAX_P2P_BYTES,
                    max_coll_bytes: MAX_COLL_BYTES,
                    rma: rma_props(flavour, &caps),
                    mr_key_size: caps.rma_caps.as_ref().map_or(0, |r| r.key_size),
                };
                let f = fabric.clone();
                let open = move || -> Result<Arc<dyn Transport>> { Ok(Arc::new(f.endpoint())) };
                Device::new(i, props, cfg, flavour, Box::new(open))
            })
            .collect();
        Plugin {
            flavour,
            devices,
            provider: "loopback".into(),
            providers: vec!["loopback".into()],
        }
    }

    /// The device numbered `dev` (the `dev` argument of NCCL calls).
    pub fn device(&self, dev: i32) -> Result<&Device> {
        usize::try_from(dev)
            .ok()
            .and_then(|d| self.devices.get(d))
            .ok_or_else(|| {
                Error::arg(
                    "dev",
                    format!("{dev} is not a device index (0..{})", self.devices.len()),
                )
            })
    }

    /// The device owning handle `h`, which must be of kind `kind`.
    pub fn device_of(&self, h: u64, kind: Kind, what: &str) -> Result<&Device> {
        if handle_kind(h) != kind as u8 {
            return Err(Error::arg(
                what,
                format!("{h:#x} is not a {kind:?} handle of this plugin"),
            ));
        }
        self.devices
            .get(handle_dev(h))
            .ok_or_else(|| Error::arg(what, format!("{h:#x} is not a handle of this plugin")))
    }
}

/// RMA for the Neuron tables, where the transport offers it (at peers' virtual addresses, which
/// `Caps::rma_caps` promises); NCCL's tables have no RMA calls.
fn rma_props(flavour: Flavour, caps: &crate::transport::Caps) -> Option<RmaProps> {
    match (&caps.rma_caps, flavour) {
        (Some(r), Flavour::Neuron) => Some(RmaProps {
            inline_bytes: r.inject_size,
        }),
        _ => None,
    }
}

static PLUGIN: OnceCell<Result<Plugin>> = OnceCell::new();
static NEURON_PLUGIN: OnceCell<Result<Plugin>> = OnceCell::new();

/// The process-wide plugin of NCCL's tables, discovered on first use.
pub fn global() -> Result<&'static Plugin> {
    global_as(Flavour::Nccl)
}

/// The process-wide plugin of `flavour`'s tables, discovered on first use. Only one flavour
/// is exported by a library; the other exists for tests.
pub fn global_as(flavour: Flavour) -> Result<&'static Plugin> {
    let cell = match flavour {
        Flavour::Nccl => &PLUGIN,
        Flavour::Neuron => &NEURON_PLUGIN,
    };
    cell.get_or_init(|| Plugin::discover_as(crate::config::get()?, flavour))
        .as_ref()
        .map_err(Clone::clone)
}
