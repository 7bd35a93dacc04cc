//! The table types `ncclNet_v6_t` ... `ncclNet_v12_t` and the exported statics
//! `ncclNetPlugin_v6` ... `ncclNetPlugin_v12`: which function serves which slot of each version.
//! The statics carry NCCL's symbol names; the Neuron flavour compiles them without exporting.
#![allow(non_upper_case_globals)]
use super::super::types::*;
use super::multi::{
    close_recv_v11, close_send_v11, get_properties_v11, irecv_v11, isend_v11, test_v11,
};
use super::shims::*;
use super::*;
use std::os::raw::{c_char, c_int};

pub(crate) type FDevices = unsafe extern "C" fn(*mut c_int) -> Res;
pub(crate) type FRegDmaBuf =
    unsafe extern "C" fn(VoidP, VoidP, usize, c_int, u64, c_int, VoidPP) -> Res;
pub(crate) type FDereg = unsafe extern "C" fn(VoidP, VoidP) -> Res;
type FFlush = unsafe extern "C" fn(VoidP, c_int, VoidPP, *mut c_int, VoidPP, VoidPP) -> Res;
pub(crate) type FTest = unsafe extern "C" fn(VoidP, *mut c_int, *mut c_int) -> Res;
pub(crate) type FClose = unsafe extern "C" fn(VoidP) -> Res;
type FGetDeviceMr = Option<unsafe extern "C" fn(VoidP, VoidP, VoidPP) -> Res>;
type FIrecvConsumed = Option<unsafe extern "C" fn(VoidP, c_int, VoidP) -> Res>;
pub(crate) type FMakeVDevice<P> = Option<unsafe extern "C" fn(*mut c_int, *mut P) -> Res>;

macro_rules! net_table {
    ($name:ident { $($field:ident : $ty:ty),* $(,)? }) => {
        #[repr(C)]
        pub struct $name {
            pub name: *const c_char,
            $(pub $field: $ty,)*
        }
        // SAFETY: the table is immutable static data: a pointer to a static string and fn pointers.
        unsafe impl Sync for $name {}
    };
}

net_table!(NetV6 {
    init: unsafe extern "C" fn(Logger) -> Res,
    devices: FDevices,
    get_properties: unsafe extern "C" fn(c_int, *mut PropsV6) -> Res,
    listen: unsafe extern "C" fn(c_int, VoidP, VoidPP) -> Res,
    connect: unsafe extern "C" fn(c_int, VoidP, VoidPP) -> Res,
    accept: unsafe extern "C" fn(VoidP, VoidPP) -> Res,
    reg_mr: unsafe extern "C" fn(VoidP, VoidP, c_int, c_int, VoidPP) -> Res,
    reg_mr_dmabuf: FRegDmaBuf,
    dereg_mr: FDereg,
    isend: unsafe extern "C" fn(VoidP, VoidP, c_int, c_int, VoidP, VoidPP) -> Res,
    irecv: unsafe extern "C" fn(VoidP, c_int, VoidPP, *mut c_int, *mut c_int, VoidPP, VoidPP) -> Res,
    iflush: FFlush,
    test: FTest,
    close_send: FClose,
    close_recv: FClose,
    close_listen: FClose,
});

net_table!(NetV7 {
    init: unsafe extern "C" fn(Logger) -> Res,
    devices: FDevices,
    get_properties: unsafe extern "C" fn(c_int, *mut PropsV7) -> Res,
    listen: unsafe extern "C" fn(c_int, VoidP, VoidPP) -> Res,
    connect: unsafe extern "C" fn(c_int, VoidP, VoidPP, VoidPP) -> Res,
    accept: unsafe extern "C" fn(VoidP, VoidPP, VoidPP) -> Res,
    reg_mr: unsafe extern "C" fn(VoidP, VoidP, c_int, c_int, VoidPP) -> Res,
    reg_mr_dmabuf: FRegDmaBuf,
    dereg_mr: FDereg,
    isend: unsafe extern "C" fn(VoidP, VoidP, c_int, c_int, VoidP, VoidPP) -> Res,
    irecv: unsafe extern "C" fn(VoidP, c_int, VoidPP, *mut c_int, *mut c_int, VoidPP, VoidPP) -> Res,
    iflush: FFlush,
    test: FTest,
    close_send: FClose,
    close_recv: FClose,
    close_listen: FClose,
    get_device_mr: FGetDeviceMr,
    irecv_consumed: FIrecvConsumed,
});

net_table!(NetV8 {
    init: unsafe extern "C" fn(Logger) -> Res,
    devices: FDevices,
    get_properties: unsafe extern "C" fn(c_int, *mut PropsV8) -> Res,
    listen: unsafe extern "C" fn(c_int, VoidP, VoidPP) -> Res,
    connect: unsafe extern "C" fn(c_int, VoidP, VoidPP, VoidPP) -> Res,
    accept: unsafe extern "C" fn(VoidP, VoidPP, VoidPP) -> Res,
    reg_mr: unsafe extern "C" fn(VoidP, VoidP, usize, c_int, VoidPP) -> Res,
    reg_mr_dmabuf: FRegDmaBuf,
    dereg_mr: FDereg,
    isend: unsafe extern "C" fn(VoidP, VoidP, c_int, c_int, VoidP, VoidPP) -> Res,
    irecv: unsafe extern "C" fn(VoidP, c_int, VoidPP, *mut c_int, *mut c_int, VoidPP, VoidPP) -> Res,
    iflush: FFlush,
    test: FTest,
    close_send: FClose,
    close_recv: FClose,
    close_listen: FClose,
    get_device_mr: FGetDeviceMr,
    irecv_consumed: FIrecvConsumed,
});

net_table!(NetV9 {
    init: unsafe extern "C" fn(Logger) -> Res,
    devices: FDevices,
    get_properties: unsafe extern "C" fn(c_int, *mut PropsV9) -> Res,
    listen: unsafe extern "C" fn(c_int, VoidP, VoidPP) -> Res,
    connect: unsafe extern "C" fn(c_int, VoidP, VoidPP, VoidPP) -> Res,
    accept: unsafe extern "C" fn(VoidP, VoidPP, VoidPP) -> Res,
    reg_mr: unsafe extern "C" fn(VoidP, VoidP, usize, c_int, VoidPP) -> Res,
    reg_mr_dmabuf: FRegDmaBuf,
    dereg_mr: FDereg,
    isend: unsafe extern "C" fn(VoidP, VoidP, usize, c_int, VoidP, VoidPP) -> Res,
    irecv: unsafe extern "C" fn(VoidP, c_int, VoidPP, *mut usize, *mut c_int, VoidPP, VoidPP) -> Res,
    iflush: FFlush,
    test: FTest,
    close_send: FClose,
    close_recv: FClose,
    close_listen: FClose,
    get_device_mr: FGetDeviceMr,
    irecv_consumed: FIrecvConsumed,
    make_vdevice: FMakeVDevice<VDevPropsV9>,
});

net_table!(NetV10 {
    init: unsafe extern "C" fn(Logger, VoidP) -> Res,
    devices: FDevices,
    get_properties: unsafe extern "C" fn(c_int, *mut PropsV9) -> Res,
    listen: unsafe extern "C" fn(c_int, VoidP, VoidPP) -> Res,
    connect: unsafe extern "C" fn(c_int, VoidP, VoidP, VoidPP, VoidPP) -> Res,
    accept: unsafe extern "C" fn(VoidP, VoidPP, VoidPP) -> Res,
    reg_mr: unsafe extern "C" fn(VoidP, VoidP, usize, c_int, VoidPP) -> Res,
    reg_mr_dmabuf: FRegDmaBuf,
    dereg_mr: FDereg,
    isend: unsafe extern "C" fn(VoidP, VoidP, usize, c_int, VoidP, VoidP, VoidPP) -> Res,
    irecv: unsafe extern "C" fn(VoidP, c_int, VoidPP, *mut usize, *mut c_int, VoidPP, VoidPP, VoidPP) -> Res,
    iflush: FFlush,
    test: FTest,
    close_send: FClose,
    close_recv: FClose,
    close_listen: FClose,
    get_device_mr: FGetDeviceMr,
    irecv_consumed: FIrecvConsumed,
    make_vdevice: FMakeVDevice<VDevPropsV9>,
});

macro_rules! net_table_v11 {
    ($name:ident, $props:ty, $vprops:ty) => {
        net_table!($name {
            init: unsafe extern "C" fn(VoidPP, u64, VoidP, Logger, VoidP) -> Res,
            devices: FDevices,
            get_properties: unsafe extern "C" fn(c_int, *mut $props) -> Res,
            listen: unsafe extern "C" fn(VoidP, c_int, VoidP, VoidPP) -> Res,
            connect: unsafe extern "C" fn(VoidP, c_int, VoidP, VoidPP, VoidPP) -> Res,
            accept: unsafe extern "C" fn(VoidP, VoidPP, VoidPP) -> Res,
            reg_mr: unsafe extern "C" fn(VoidP, VoidP, usize, c_int, VoidPP) -> Res,
            reg_mr_dmabuf: FRegDmaBuf,
            dereg_mr: FDereg,
            isend: unsafe extern "C" fn(VoidP, VoidP, usize, c_int, VoidP, VoidP, VoidPP) -> Res,
            irecv: unsafe extern "C" fn(VoidP, c_int, VoidPP, *mut usize, *mut c_int, VoidPP, VoidPP, VoidPP) -> Res,
            iflush: FFlush,
            test: FTest,
            close_send: FClose,
            close_recv: FClose,
            close_listen: FClose,
            get_device_mr: FGetDeviceMr,
            irecv_consumed: FIrecvConsumed,
            make_vdevice: FMakeVDevice<$vprops>,
            finalize: FClose,
            set_net_attr: unsafe extern "C" fn(VoidP, VoidP) -> Res,
        });
    };
}
net_table_v11!(NetV11, PropsV11, VDevPropsV9);
net_table_v11!(NetV12, PropsV12, VDevPropsV12);

const _: () = {
    use std::mem::size_of;
    assert!(size_of::<NetV6>() == 136);
    assert!(size_of::<NetV7>() == 152 && size_of::<NetV8>() == 152);
    assert!(size_of::<NetV9>() == 160 && size_of::<NetV10>() == 160);
    assert!(size_of::<NetV11>() == 176 && size_of::<NetV12>() == 176);
};

/// The plugin's name (`NCCL_NET=fabricoll`).
pub const NAME: &std::ffi::CStr = c"fabricoll";

#[cfg_attr(not(feature = "neuron"), no_mangle)]
pub static ncclNetPlugin_v12: NetV12 = NetV12 {
    name: NAME.as_ptr(),
    init: init_v11,
    devices: devices::<Nccl>,
    get_properties: get_properties_v11::<PropsV12>,
    listen,
    connect,
    accept,
    reg_mr: reg_mr::<usize>,
    reg_mr_dmabuf,
    dereg_mr,
    isend: isend_v11,
    irecv: irecv_v11,
    iflush: iflush::<Nccl>,
    test: test_v11,
    close_send: close_send_v11,
    close_recv: close_recv_v11,
    close_listen,
    get_device_mr: None,
    irecv_consumed: None,
    make_vdevice: None,
    finalize,
    set_net_attr,
};

#[cfg_attr(not(feature = "neuron"), no_mangle)]
pub static ncclNetPlugin_v11: NetV11 = NetV11 {
    name: NAME.as_ptr(),
    init: init_v11,
    devices: devices::<Nccl>,
    get_properties: get_properties_v11::<PropsV11>,
    listen,
    connect,
    accept,
    reg_mr: reg_mr::<usize>,
    reg_mr_dmabuf,
    dereg_mr,
    isend: isend_v11,
    irecv: irecv_v11,
    iflush: iflush::<Nccl>,
    test: test_v11,
    close_send: close_send_v11,
    close_recv: close_recv_v11,
    close_listen,
    get_device_mr: None,
    irecv_consumed: None,
    make_vdevice: None,
    finalize,
    set_net_attr,
};

#[cfg_attr(not(feature = "neuron"), no_mangle)]
pub static ncclNetPlugin_v10: NetV10 = NetV10 {
    name: NAME.as_ptr(),
    init: init_v10,
    devices: devices::<Nccl>,
    get_properties: get_properties::<Nccl, PropsV9>,
    listen: listen_v6,
    connect: connect_v10,
    accept,
    reg_mr: reg_mr::<usize>,
    reg_mr_dmabuf,
    dereg_mr,
    isend: isend::<usize>,
    irecv: irecv::<usize>,
    iflush: iflush::<Nccl>,
    test: test::<Nccl>,
    close_send,
    close_recv,
    close_listen,
    get_device_mr: None,
    irecv_consumed: None,
    make_vdevice: None,
};

#[cfg_attr(not(feature = "neuron"), no_mangle)]
pub static ncclNetPlugin_v9: NetV9 = NetV9 {
    name: NAME.as_ptr(),
    init: init_v6,
    devices: devices::<Nccl>,
    get_properties: get_properties::<Nccl, PropsV9>,
    listen: listen_v6,
    connect: connect_v7,
    accept,
    reg_mr: reg_mr::<usize>,
    reg_mr_dmabuf,
    dereg_mr,
    isend: isend_v9,
    irecv: irecv_v9,
    iflush: iflush::<Nccl>,
    test: test::<Nccl>,
    close_send,
    close_recv,
    close_listen,
    get_device_mr: None,
    irecv_consumed: None,
    make_vdevice: None,
};

#[cfg_attr(not(feature = "neuron"), no_mangle)]
pub static ncclNetPlugin_v8: NetV8 = NetV8 {
    name: NAME.as_ptr(),
    init: init_v6,
    devices: devices::<Nccl>,
    get_properties: get_properties::<Nccl, PropsV8>,
    listen: listen_v6,
    connect: connect_v7,
    accept,
    reg_mr: reg_mr::<usize>,
    reg_mr_dmabuf,
    dereg_mr,
    isend: isend_v6,
    irecv: irecv_v6,
    iflush: iflush::<Nccl>,
    test: test::<Nccl>,
    close_send,
    close_recv,
    close_listen,
    get_device_mr: None,
    irecv_consumed: None,
};

#[cfg_attr(not(feature = "neuron"), no_mangle)]
pub static ncclNetPlugin_v7: NetV7 = NetV7 {
    name: NAME.as_ptr(),
    init: init_v6,
    devices: devices::<Nccl>,
    get_properties: get_properties::<Nccl, PropsV7>,
    listen: listen_v6,
    connect: connect_v7,
    accept,
    reg_mr: reg_mr::<c_int>,
    reg_mr_dmabuf,
    dereg_mr,
    isend: isend_v6,
    irecv: irecv_v6,
    iflush: iflush::<Nccl>,
    test: test::<Nccl>,
    close_send,
    close_recv,
    close_listen,
    get_device_mr: None,
    irecv_consumed: None,
};

#[cfg_attr(not(feature = "neuron"), no_mangle)]
pub static ncclNetPlugin_v6: NetV6 = NetV6 {
    name: NAME.as_ptr(),
    init: init_v6,
    devices: devices::<Nccl>,
    get_properties: get_properties::<Nccl, PropsV6>,
    listen: listen_v6,
    connect: connect_v6,
    accept: accept_v6,
    reg_mr: reg_mr::<c_int>,
    reg_mr_dmabuf,
    dereg_mr,
    isend: isend_v6,
    irecv: irecv_v6,
    iflush: iflush::<Nccl>,
    test: test::<Nccl>,
    close_send,
    close_recv,
    close_listen,
};
