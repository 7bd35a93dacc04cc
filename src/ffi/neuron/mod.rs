//! `ncclNetPlugin_v4` ... `ncclNetPlugin_v6` as AWS Neuron's libnccom defines them (exported only
//! by the Neuron flavour, `libnccom-net.so`). The semantics are the net plugin's; what differs is
//! the ABI (`types`), the lifecycle (`lifecycle`: init, fini, init again), v4's blocking setup
//! with 64-byte handles, and RMA (`rma`). Each export checks its arguments and makes one call
//! into the plugin inside the panic boundary; `tables` says which function fills which slot.
pub(crate) mod lifecycle;
mod rma;
mod tables;
pub mod types;

pub use tables::*;

use super::net::{
    accept_inner, comm_device, connect_inner, iflush, irecv_inner, isend_inner, listen_inner,
    recv_bufs, reg_mr_inner, Logger, Res, Source, VoidP, VoidPP,
};
use super::{boundary, h, int_size, non_null, Out};
use crate::error::{Error, Result};
use crate::plugin::{Kind, Plugin, HANDLE_SIZE};
use lifecycle::{closed_by_fini, plugin};
use std::os::raw::c_int;
use std::time::{Duration, Instant};

/// v4's handle size (`NCCL_NET_HANDLE_MAXSIZE_V4`).
pub const HANDLE_SIZE_V4: usize = 64;

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

/// v4 listen: the handle carries 64 bytes, so the listener's address must fit in them.
unsafe extern "C" fn listen_v4(dev: c_int, handle: VoidP, listen_comm: VoidPP) -> Res {
    boundary("listen", || {
        non_null(handle, "handle")?;
        // SAFETY: libnccom passes a writable void* out-pointer.
        let out = unsafe { Out::new(listen_comm, "listenComm") }?;
        let p = plugin()?;
        let mut full = [0u8; HANDLE_SIZE];
        listen_inner(p, dev, full.as_mut_ptr().cast(), &out)?;
        if full[HANDLE_SIZE_V4..].iter().any(|b| *b != 0) {
            // SAFETY: `out` was just set to the listen comm made above.
            let l = h(unsafe { *listen_comm });
            let _ = p
                .device_of(l, Kind::Listen, "listenComm")
                .and_then(|d| d.close_listen(l));
            out.set(std::ptr::null_mut());
            return Err(Error::InvalidUsage(format!(
                "listen: the endpoint address of provider {} does not fit the {HANDLE_SIZE_V4}-byte \
                 handle of ncclNet_v4 (use v5 or v6, or another provider)",
                p.provider
            )));
        }
        // SAFETY: v4 handles are NCCL_NET_HANDLE_MAXSIZE_V4 (64) writable bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(full.as_ptr(), handle.cast(), HANDLE_SIZE_V4);
        }
        Ok(())
    })
}

/// Call `step` until it yields a comm: v4's connect and accept block. The deadline is
/// `FABRICOLL_TIMEOUT_MS`.
fn block_until(what: &str, mut step: impl FnMut() -> Result<VoidP>) -> Result<VoidP> {
    let timeout = crate::config::get()?.timeout;
    let start = Instant::now();
    for i in 0u64.. {
        let c = step()?;
        if !c.is_null() {
            return Ok(c);
        }
        if start.elapsed() > timeout {
            return Err(Error::Timeout(format!(
                "{what}: no peer within {} ms (FABRICOLL_TIMEOUT_MS)",
                timeout.as_millis()
            )));
        }
        if i < 1000 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    unreachable!("the loop returns")
}

unsafe extern "C" fn connect_v4(dev: c_int, handle: VoidP, send_comm: VoidPP) -> Res {
    boundary("connect", || {
        non_null(handle, "handle")?;
        // SAFETY: libnccom passes a writable void* out-pointer.
        let out = unsafe { Out::new(send_comm, "sendComm") }?;
        let p = plugin()?;
        let mut full = [0u8; HANDLE_SIZE];
        // SAFETY: v4 handles are 64 readable bytes.
        unsafe { std::ptr::copy_nonoverlapping(handle.cast(), full.as_mut_ptr(), HANDLE_SIZE_V4) };
        let c = block_until("connect", || {
            let mut c: VoidP = std::ptr::null_mut();
            // SAFETY: `c` is a local void*.
            let o = unsafe { Out::new(&mut c, "sendComm") }?;
            connect_inner(p, dev, full.as_mut_ptr().cast(), &o, std::ptr::null_mut())?;
            Ok(c)
        })?;
        out.set(c);
        Ok(())
    })
}

unsafe extern "C" fn accept_v4(listen_comm: VoidP, recv_comm: VoidPP) -> Res {
    boundary("accept", || {
        // SAFETY: libnccom passes a writable void* out-pointer.
        let out = unsafe { Out::new(recv_comm, "recvComm") }?;
        let p = plugin()?;
        let c = block_until("accept", || {
            let mut c: VoidP = std::ptr::null_mut();
            // SAFETY: `c` is a local void*.
            let o = unsafe { Out::new(&mut c, "recvComm") }?;
            accept_inner(p, listen_comm, &o, std::ptr::null_mut())?;
            Ok(c)
        })?;
        out.set(c);
        Ok(())
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

unsafe extern "C" fn isend(
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

/// v4 isend: no tag (tag 0).
unsafe extern "C" fn isend_v4(
    comm: VoidP,
    data: VoidP,
    size: c_int,
    mh: VoidP,
    req: VoidPP,
) -> Res {
    // SAFETY: forwarded.
    unsafe { isend(comm, data, size, 0, mh, req) }
}

unsafe extern "C" fn irecv(
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

/// v4 irecv: one buffer, tag 0.
unsafe extern "C" fn irecv_v4(
    comm: VoidP,
    data: VoidP,
    size: c_int,
    mh: VoidP,
    req: VoidPP,
) -> Res {
    let (mut data, mut size, mut tag, mut mh) = (data, size, 0 as c_int, mh);
    // SAFETY: one-element arrays on this stack frame.
    unsafe { irecv(comm, 1, &mut data, &mut size, &mut tag, &mut mh, req) }
}

/// v4 iflush: one buffer.
unsafe extern "C" fn iflush_v4(
    comm: VoidP,
    data: VoidP,
    size: c_int,
    mh: VoidP,
    req: VoidPP,
) -> Res {
    let (mut data, mut size, mut mh) = (data, size, mh);
    // SAFETY: one-element arrays on this stack frame.
    unsafe { iflush::<Neuron>(comm, 1, &mut data, &mut size, &mut mh, req) }
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
