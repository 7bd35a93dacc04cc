//! `ncclNetPlugin_v4` ... `ncclNetPlugin_v6` as AWS Neuron's libnccom defines them (exported only
//! by the Neuron flavour, `libnccom-net.so`). The semantics are the net plugin's; what differs is
//! the ABI (`types`), the lifecycle (`lifecycle`: init, fini, init again), v4's blocking setup
//! with 64-byte handles and its one-buffer calls (`v4`), and RMA (`rma`). Each export checks its arguments and makes one call
//! into the plugin inside the panic boundary; `tables` says which function fills which slot.
pub(crate) mod lifecycle;
mod rma;
mod tables;
pub mod types;
mod v4;

pub use tables::*;

use super::net::{
    accept_inner, comm_device, connect_inner, irecv_inner, isend_inner, listen_inner, recv_bufs,
    reg_mr_inner, Logger, Res, Source, VoidP, VoidPP,
};
use super::{boundary, h, int_size, Out};
use crate::error::{Error, Result};
use crate::plugin::{Kind, Plugin};
use lifecycle::{closed_by_fini, plugin};
use std::os::raw::c_int;

unsafe extern "C" fn init(logger: Logger) -> Res {
    boundary("init", || lifecycle::init(logger))
}

unsafe extern "C" fn fini() -> Res {
    boundary("fini", lifecycle::fini)
}

/// Neuron's tables: the Neuron plugin, between `init` and `fini`.
pub(crate) struct Neuron;

impl Source for Neuron {
    fn plugin() -> Result<&'static Plugin> {
        plugin()
    }
}

unsafe extern "C" fn listen(dev: c_int, handle: VoidP, listen_comm: VoidPP) -> Res {
    boundary("listen", || {
        // SAFETY: libnccom passes a writable void* out-pointer.
        let out = unsafe { Out::new(listen_comm, "listenComm") }?;
        listen_inner(plugin()?, dev, handle, &out)
    })
}

unsafe extern "C" fn connect(dev: c_int, handle: VoidP, send_comm: VoidPP) -> Res {
    boundary("connect", || {
        // SAFETY: libnccom passes a writable void* out-pointer.
        let out = unsafe { Out::new(send_comm, "sendComm") }?;
        connect_inner(plugin()?, dev, handle, &out, std::ptr::null_mut())
    })
}

unsafe extern "C" fn accept(listen_comm: VoidP, recv_comm: VoidPP) -> Res {
    boundary("accept", || {
        // SAFETY: libnccom passes a writable void* out-pointer.
        let out = unsafe { Out::new(recv_comm, "recvComm") }?;
        accept_inner(plugin()?, listen_comm, &out, std::ptr::null_mut())
    })
}

unsafe extern "C" fn reg_mr(comm: VoidP, data: VoidP, size: usize, ty: c_int, mh: VoidPP) -> Res {
    boundary("regMr", || {
        // SAFETY: libnccom passes a writable void* out-pointer.
        let out = unsafe { Out::new(mh, "mhandle") }?;
        reg_mr_inner(plugin()?, comm, data, size, ty, &out)
    })
}

/// regMrDmaBuf: with no dma-buf (fd -1) it is regMr, as libnccom uses it; a dma-buf is device
/// memory, which this plugin cannot register.
unsafe extern "C" fn reg_mr_dmabuf(
    comm: VoidP,
    data: VoidP,
    size: usize,
    ty: c_int,
    offset: u64,
    fd: c_int,
    mh: VoidPP,
) -> Res {
    boundary("regMrDmaBuf", || {
        // SAFETY: libnccom passes a writable void* out-pointer.
        let out = unsafe { Out::new(mh, "mhandle") }?;
        out.set(std::ptr::null_mut());
        if fd != -1 {
            return Err(Error::InvalidUsage(format!(
                "regMrDmaBuf: dma-buf fd {fd} (offset {offset}): device memory cannot be \
                 registered here (ptrSupport is NCCL_PTR_HOST)"
            )));
        }
        reg_mr_inner(plugin()?, comm, data, size, ty, &out)
    })
}

unsafe extern "C" fn dereg_mr(comm: VoidP, mh: VoidP) -> Res {
    boundary("deregMr", || {
        if closed_by_fini(h(mh)) {
            return Ok(());
        }
        comm_device(plugin()?, comm)?.dereg_mr(h(comm), h(mh))
    })
}

pub(super) unsafe extern "C" fn isend(
    comm: VoidP,
    data: VoidP,
    size: c_int,
    tag: c_int,
    mh: VoidP,
    req: VoidPP,
) -> Res {
    boundary("isend", || {
        // SAFETY: libnccom passes a writable void* out-pointer.
        let out = unsafe { Out::new(req, "request") }?;
        out.set(std::ptr::null_mut());
        isend_inner(
            plugin()?,
            comm,
            data,
            int_size(size, "size")?,
            tag,
            mh,
            &out,
        )
    })
}

pub(super) unsafe extern "C" fn irecv(
    comm: VoidP,
    n: c_int,
    data: VoidPP,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhs: VoidPP,
    req: VoidPP,
) -> Res {
    boundary("irecv", || {
        // SAFETY: libnccom passes a writable void* out-pointer.
        let out = unsafe { Out::new(req, "request") }?;
        out.set(std::ptr::null_mut());
        // SAFETY: the arrays have n elements (n is checked before reading); the buffers live
        // until test() reports done.
        let bufs = unsafe { recv_bufs(n, data, sizes, tags, mhs) };
        irecv_inner(plugin()?, comm, bufs, &out)
    })
}

/// Close `comm` of `kind`, unless `fini` already did (then quietly).
fn close(comm: VoidP, kind: Kind, what: &str) -> Result<()> {
    let c = h(comm);
    if closed_by_fini(c) {
        return Ok(());
    }
    let p: &Plugin = plugin()?;
    let d = p.device_of(c, kind, what)?;
    match kind {
        Kind::Send => d.close_send(c),
        Kind::Recv => d.close_recv(c),
        _ => d.close_listen(c),
    }
}

unsafe extern "C" fn close_send(comm: VoidP) -> Res {
    boundary("closeSend", || close(comm, Kind::Send, "sendComm"))
}

unsafe extern "C" fn close_recv(comm: VoidP) -> Res {
    boundary("closeRecv", || close(comm, Kind::Recv, "recvComm"))
}

unsafe extern "C" fn close_listen(comm: VoidP) -> Res {
    boundary("closeListen", || close(comm, Kind::Listen, "listenComm"))
}
