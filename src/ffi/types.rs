//! NCCL plugin ABI structs, as docs/nccl-abi.md describes them, with their sizes and offsets
//! checked at compile time.
use crate::plugin::DeviceProps;
use std::mem::{offset_of, size_of};
use std::os::raw::{c_char, c_int};

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct VDevPropsV9 {
    pub ndevs: c_int,
    pub devs: [c_int; 4],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct VDevPropsV12 {
    pub ndevs: c_int,
    pub devs: [c_int; 8],
}

#[repr(C)]
pub struct PropsV6 {
    pub name: *const c_char,
    pub pci_path: *const c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
}

#[repr(C)]
pub struct PropsV7 {
    pub v6: PropsV6,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

#[repr(C)]
pub struct PropsV8 {
    pub name: *const c_char,
    pub pci_path: *const c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

macro_rules! props_v9_fields {
    ($name:ident, $vprops:ty $(, $extra:ident : $ety:ty)*) => {
        #[repr(C)]
        pub struct $name {
            pub name: *const c_char,
            pub pci_path: *const c_char,
            pub guid: u64,
            pub ptr_support: c_int,
            pub reg_is_global: c_int,
            pub force_flush: c_int,
            pub speed: c_int,
            pub port: c_int,
            pub latency: f32,
            pub max_comms: c_int,
            pub max_recvs: c_int,
            pub net_device_type: c_int,
            pub net_device_version: c_int,
            pub vprops: $vprops,
            pub max_p2p_bytes: usize,
            pub max_coll_bytes: usize,
            $(pub $extra: $ety,)*
        }
    };
}
props_v9_fields!(PropsV9, VDevPropsV9);
props_v9_fields!(PropsV11, VDevPropsV9, max_multi_request_size: c_int);
props_v9_fields!(PropsV12, VDevPropsV12, max_multi_request_size: c_int, rail_id: i16, plane_id: i16);

const _: () = {
    assert!(size_of::<PropsV6>() == 48);
    assert!(offset_of!(PropsV6, guid) == 16 && offset_of!(PropsV6, ptr_support) == 24);
    assert!(offset_of!(PropsV6, speed) == 28 && offset_of!(PropsV6, latency) == 36);
    assert!(offset_of!(PropsV6, max_recvs) == 44);
    assert!(size_of::<PropsV7>() == 56 && offset_of!(PropsV7, net_device_type) == 48);
    assert!(size_of::<PropsV8>() == 64 && offset_of!(PropsV8, reg_is_global) == 28);
    assert!(size_of::<PropsV9>() == 104 && offset_of!(PropsV9, force_flush) == 32);
    assert!(offset_of!(PropsV9, vprops) == 64 && offset_of!(PropsV9, max_p2p_bytes) == 88);
    assert!(offset_of!(PropsV9, max_coll_bytes) == 96);
    assert!(size_of::<PropsV11>() == 112 && offset_of!(PropsV11, max_multi_request_size) == 104);
    assert!(size_of::<PropsV12>() == 128 && offset_of!(PropsV12, vprops) == 64);
    assert!(
        offset_of!(PropsV12, max_p2p_bytes) == 104 && offset_of!(PropsV12, max_coll_bytes) == 112
    );
    assert!(offset_of!(PropsV12, max_multi_request_size) == 120);
    assert!(offset_of!(PropsV12, rail_id) == 124 && offset_of!(PropsV12, plane_id) == 126);
};

/// `ncclNetDeviceType` HOST with version 0: what a host plugin must report.
const DEVICE_HOST: c_int = 0;

pub(crate) fn pci(p: &DeviceProps) -> *const c_char {
    p.pci_path.as_ref().map_or(std::ptr::null(), |c| c.as_ptr())
}

impl From<&DeviceProps> for PropsV6 {
    fn from(p: &DeviceProps) -> Self {
        PropsV6 {
            name: p.name.as_ptr(),
            pci_path: pci(p),
            guid: p.guid,
            ptr_support: p.ptr_support,
            speed: p.speed_mbps,
            port: p.port,
            latency: p.latency_us,
            max_comms: p.max_comms,
            max_recvs: p.max_recvs,
        }
    }
}

impl From<&DeviceProps> for PropsV7 {
    fn from(p: &DeviceProps) -> Self {
        PropsV7 {
            v6: p.into(),
            net_device_type: DEVICE_HOST,
            net_device_version: 0,
        }
    }
}

impl From<&DeviceProps> for PropsV8 {
    fn from(p: &DeviceProps) -> Self {
        PropsV8 {
            name: p.name.as_ptr(),
            pci_path: pci(p),
            guid: p.guid,
            ptr_support: p.ptr_support,
            reg_is_global: p.reg_is_global as c_int,
            speed: p.speed_mbps,
            port: p.port,
            latency: p.latency_us,
            max_comms: p.max_comms,
            max_recvs: p.max_recvs,
            net_device_type: DEVICE_HOST,
            net_device_version: 0,
        }
    }
}

macro_rules! from_props_v9 {
    ($t:ident, $vp:ty $(, $extra:ident : $val:expr)*) => {
        impl From<&DeviceProps> for $t {
            fn from(p: &DeviceProps) -> Self {
                $t {
                    name: p.name.as_ptr(),
                    pci_path: pci(p),
                    guid: p.guid,
                    ptr_support: p.ptr_support,
                    reg_is_global: p.reg_is_global as c_int,
                    // Data and completions take one path: a finished receive is in place
                    // (for device memory, `iflush` orders it where NCCL's topology asks).
                    force_flush: 0,
                    speed: p.speed_mbps,
                    port: p.port,
                    latency: p.latency_us,
                    max_comms: p.max_comms,
                    max_recvs: p.max_recvs,
                    net_device_type: DEVICE_HOST,
                    net_device_version: 0,
                    // A physical device: it is its own single child.
                    vprops: {
                        let mut v = <$vp>::default();
                        v.ndevs = 1;
                        v.devs[0] = p.index as c_int;
                        v
                    },
                    max_p2p_bytes: p.max_p2p_bytes,
                    max_coll_bytes: p.max_coll_bytes,
                    $($extra: $val,)*
                }
            }
        }
    };
}
/// `railId` / `planeId` when nothing says (NCCL_NET_ID_UNDEF; NCCL then ignores them). We
/// report it always: libfabric 1.17's `fi_nic` (device, bus and link attributes) and the PCI
/// device's sysfs directory name a NIC and its slot, but no rail or plane, which are how the
/// cluster's switches are wired, and NCCL's own IB and Socket transports report -1 as well.
pub const NET_ID_UNDEF: i16 = -1;

// maxMultiRequestSize is 1 here, what CollNet reports (it has no isend / irecv); the net tables
// write their own through `MultiRequestProps` (ffi/net/multi.rs).
from_props_v9!(PropsV9, VDevPropsV9);
from_props_v9!(PropsV11, VDevPropsV9, max_multi_request_size: 1);
from_props_v9!(PropsV12, VDevPropsV12, max_multi_request_size: 1, rail_id: NET_ID_UNDEF,
    plane_id: NET_ID_UNDEF);

/// The props versions with `maxMultiRequestSize` (v11+).
pub trait MultiRequestProps {
    fn set_max_multi_request_size(&mut self, n: c_int);
}

impl MultiRequestProps for PropsV11 {
    fn set_max_multi_request_size(&mut self, n: c_int) {
        self.max_multi_request_size = n;
    }
}

impl MultiRequestProps for PropsV12 {
    fn set_max_multi_request_size(&mut self, n: c_int) {
        self.max_multi_request_size = n;
    }
}
