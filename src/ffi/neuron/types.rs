//! Neuron's own versions of the net ABI (`libnccom`'s `ncclNet_v4_t` ... `ncclNet_v6_t`),
//! as docs/neuron-abi.md describes them, with sizes and offsets checked at compile time. The
//! names are NVIDIA's; the layouts are not (size_t registration sizes, RMA slots, v6 `fini`).
use crate::ffi::net::{FClose, FDereg, FDevices, FRegDmaBuf, FTest, Logger, Res, VoidP, VoidPP};
use crate::ffi::types::pci;
use crate::plugin::DeviceProps;
use std::mem::{offset_of, size_of};
use std::os::raw::{c_char, c_int};

/// `ncclNetProperties_v4_t` (Neuron's is NVIDIA's v4).
#[repr(C)]
pub struct NeuronPropsV4 {
    pub name: *const c_char,
    pub pci_path: *const c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub max_comms: c_int,
}

/// `ncclNetProperties_v6_t`, also v5's.
#[repr(C)]
pub struct NeuronPropsV6 {
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
    pub max_write_inline_size: usize,
    pub max_mr_key_size: usize,
    pub rma_supported: c_int,
}

/// Receives per `irecv` we announce: libnccom's SENDRECV protocol takes one.
pub const NEURON_MAX_RECVS: c_int = 1;
/// libfabric ports count from 1; a domain has one.
const PORT: c_int = 1;

impl From<&DeviceProps> for NeuronPropsV4 {
    fn from(p: &DeviceProps) -> Self {
        NeuronPropsV4 {
            name: p.name.as_ptr(),
            pci_path: pci(p),
            guid: p.guid,
            ptr_support: p.ptr_support,
            speed: p.speed_mbps,
            port: PORT,
            max_comms: p.max_comms,
        }
    }
}

impl From<&DeviceProps> for NeuronPropsV6 {
    fn from(p: &DeviceProps) -> Self {
        NeuronPropsV6 {
            name: p.name.as_ptr(),
            pci_path: pci(p),
            guid: p.guid,
            ptr_support: p.ptr_support,
            reg_is_global: p.reg_is_global as c_int,
            speed: p.speed_mbps,
            port: PORT,
            latency: p.latency_us,
            max_comms: p.max_comms,
            max_recvs: NEURON_MAX_RECVS,
            max_write_inline_size: p.rma.map_or(0, |r| r.inline_bytes),
            max_mr_key_size: p.mr_key_size,
            rma_supported: p.rma.is_some() as c_int,
        }
    }
}

type FIsend = unsafe extern "C" fn(VoidP, VoidP, c_int, c_int, VoidP, VoidPP) -> Res;
type FIrecv =
    unsafe extern "C" fn(VoidP, c_int, VoidPP, *mut c_int, *mut c_int, VoidPP, VoidPP) -> Res;
type FFlush = unsafe extern "C" fn(VoidP, c_int, VoidPP, *mut c_int, VoidPP, VoidPP) -> Res;
type FGetMrKey = unsafe extern "C" fn(VoidP, *mut u64) -> Res;
type FIwrite = unsafe extern "C" fn(VoidP, VoidP, usize, VoidP, u64, u64, VoidPP) -> Res;
type FIwriteInline = unsafe extern "C" fn(VoidP, VoidP, usize, u64, u64, VoidPP) -> Res;
type FIread = unsafe extern "C" fn(VoidP, VoidP, usize, VoidP, u64, u64, VoidPP) -> Res;

/// `ncclNet_v4_t`: no tags, one buffer per call, blocking connect and accept, 64-byte handles.
#[repr(C)]
pub struct NeuronNetV4 {
    pub name: *const c_char,
    pub init: unsafe extern "C" fn(Logger) -> Res,
    pub devices: FDevices,
    pub get_properties: unsafe extern "C" fn(c_int, *mut NeuronPropsV4) -> Res,
    pub listen: unsafe extern "C" fn(c_int, VoidP, VoidPP) -> Res,
    pub connect: unsafe extern "C" fn(c_int, VoidP, VoidPP) -> Res,
    pub accept: unsafe extern "C" fn(VoidP, VoidPP) -> Res,
    pub reg_mr: unsafe extern "C" fn(VoidP, VoidP, usize, c_int, VoidPP) -> Res,
    pub dereg_mr: FDereg,
    pub isend: unsafe extern "C" fn(VoidP, VoidP, c_int, VoidP, VoidPP) -> Res,
    pub irecv: unsafe extern "C" fn(VoidP, VoidP, c_int, VoidP, VoidPP) -> Res,
    pub iflush: unsafe extern "C" fn(VoidP, VoidP, c_int, VoidP, VoidPP) -> Res,
    pub test: FTest,
    pub close_send: FClose,
    pub close_recv: FClose,
    pub close_listen: FClose,
}

macro_rules! neuron_net_table {
    ($name:ident { $($head:ident : $hty:ty),* $(,)? }) => {
        /// Neuron's `ncclNet_v5_t` / `ncclNet_v6_t`: non-blocking setup, grouped receives and RMA.
        #[repr(C)]
        pub struct $name {
            pub name: *const c_char,
            $(pub $head: $hty,)*
            pub devices: FDevices,
            pub get_properties: unsafe extern "C" fn(c_int, *mut NeuronPropsV6) -> Res,
            pub listen: unsafe extern "C" fn(c_int, VoidP, VoidPP) -> Res,
            pub connect: unsafe extern "C" fn(c_int, VoidP, VoidPP) -> Res,
            pub accept: unsafe extern "C" fn(VoidP, VoidPP) -> Res,
            pub reg_mr: unsafe extern "C" fn(VoidP, VoidP, usize, c_int, VoidPP) -> Res,
            pub reg_mr_dmabuf: FRegDmaBuf,
            pub dereg_mr: FDereg,
            pub isend: FIsend,
            pub irecv: FIrecv,
            pub iflush: FFlush,
            pub test: FTest,
            pub close_send: FClose,
            pub close_recv: FClose,
            pub close_listen: FClose,
            pub get_mr_key: FGetMrKey,
            pub iwrite: FIwrite,
            pub iwrite_inline: FIwriteInline,
            pub iread: FIread,
        }
    };
}

neuron_net_table!(NeuronNetV5 {
    init: unsafe extern "C" fn(Logger) -> Res,
});
neuron_net_table!(NeuronNetV6 {
    init: unsafe extern "C" fn(Logger) -> Res,
    fini: unsafe extern "C" fn() -> Res,
});

// SAFETY: the tables are immutable static data: a pointer to a static string and fn pointers.
unsafe impl Sync for NeuronNetV4 {}
// SAFETY: as above.
unsafe impl Sync for NeuronNetV5 {}
// SAFETY: as above.
unsafe impl Sync for NeuronNetV6 {}

const _: () = {
    assert!(size_of::<NeuronPropsV4>() == 40);
    assert!(offset_of!(NeuronPropsV4, ptr_support) == 24);
    assert!(offset_of!(NeuronPropsV4, max_comms) == 36);
    assert!(size_of::<NeuronPropsV6>() == 80);
    assert!(offset_of!(NeuronPropsV6, reg_is_global) == 28);
    assert!(offset_of!(NeuronPropsV6, latency) == 40);
    assert!(offset_of!(NeuronPropsV6, max_recvs) == 48);
    assert!(offset_of!(NeuronPropsV6, max_write_inline_size) == 56);
    assert!(offset_of!(NeuronPropsV6, max_mr_key_size) == 64);
    assert!(offset_of!(NeuronPropsV6, rma_supported) == 72);
    assert!(size_of::<NeuronNetV4>() == 128);
    assert!(offset_of!(NeuronNetV4, reg_mr) == 56 && offset_of!(NeuronNetV4, test) == 96);
    assert!(size_of::<NeuronNetV5>() == 168);
    assert!(offset_of!(NeuronNetV5, reg_mr_dmabuf) == 64);
    assert!(offset_of!(NeuronNetV5, get_mr_key) == 136 && offset_of!(NeuronNetV5, iread) == 160);
    assert!(size_of::<NeuronNetV6>() == 176);
    assert!(offset_of!(NeuronNetV6, fini) == 16 && offset_of!(NeuronNetV6, devices) == 24);
    assert!(offset_of!(NeuronNetV6, reg_mr_dmabuf) == 72);
    assert!(offset_of!(NeuronNetV6, get_mr_key) == 144 && offset_of!(NeuronNetV6, iread) == 168);
};
