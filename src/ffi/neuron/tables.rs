//! The exported statics `ncclNetPlugin_v4`, `_v5` and `_v6` of the Neuron flavour: which
//! function serves which slot. Under the NCCL flavour they are compiled (and tested) but not
//! exported, since NCCL's tables hold those names.
use super::rma::*;
use super::types::*;
use super::*;
use crate::ffi::net::{devices, get_properties, iflush, test};

/// The plugin's name in every table.
const NAME: &std::ffi::CStr = c"fabricoll";

#[cfg_attr(feature = "neuron", export_name = "ncclNetPlugin_v6")]
pub static NEURON_NET_V6: NeuronNetV6 = NeuronNetV6 {
    name: NAME.as_ptr(),
    init,
    fini,
    devices: devices::<Neuron>,
    get_properties: get_properties::<Neuron, NeuronPropsV6>,
    listen,
    connect,
    accept,
    reg_mr,
    reg_mr_dmabuf,
    dereg_mr,
    isend,
    irecv,
    iflush: iflush::<Neuron>,
    test: test::<Neuron>,
    close_send,
    close_recv,
    close_listen,
    get_mr_key,
    iwrite,
    iwrite_inline,
    iread,
};

#[cfg_attr(feature = "neuron", export_name = "ncclNetPlugin_v5")]
pub static NEURON_NET_V5: NeuronNetV5 = NeuronNetV5 {
    name: NAME.as_ptr(),
    init,
    devices: devices::<Neuron>,
    get_properties: get_properties::<Neuron, NeuronPropsV6>,
    listen,
    connect,
    accept,
    reg_mr,
    reg_mr_dmabuf,
    dereg_mr,
    isend,
    irecv,
    iflush: iflush::<Neuron>,
    test: test::<Neuron>,
    close_send,
    close_recv,
    close_listen,
    get_mr_key,
    iwrite,
    iwrite_inline,
    iread,
};

#[cfg_attr(feature = "neuron", export_name = "ncclNetPlugin_v4")]
pub static NEURON_NET_V4: NeuronNetV4 = NeuronNetV4 {
    name: NAME.as_ptr(),
    init,
    devices: devices::<Neuron>,
    get_properties: get_properties::<Neuron, NeuronPropsV4>,
    listen: v4::listen,
    connect: v4::connect,
    accept: v4::accept,
    reg_mr,
    dereg_mr,
    isend: v4::isend_v4,
    irecv: v4::irecv_v4,
    iflush: v4::iflush_v4,
    test: test::<Neuron>,
    close_send,
    close_recv,
    close_listen,
};
