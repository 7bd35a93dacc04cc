//! `ncclNetPlugin_v6` ... `ncclNetPlugin_v12`. This file holds the newest entry points, each
//! inside the panic boundary, and what they share; `shims` holds the older versions' functions,
//! which only convert arguments and call these; `tables` says which function fills which slot.
//! A function that differs between versions only in the width of a size (int before v8/v9,
//! size_t after) or in the props struct it writes is one generic function. `multi` holds the
//! v11 / v12 entry points that know NCCL's multi-request groups.
mod multi;
mod shims;
mod tables;

pub use crate::plugin::multi::{live_groups, MAX_GROUP};
pub use multi::NCCL_NET_MULTI_REQUEST;
pub(crate) use shims::init_v6;
pub use tables::*;

use super::{boundary, h, int_size, non_null, ptr, region, Out};
use crate::error::{Error, Result};
use crate::ffi::logging::{self, NcclLogger};
use crate::plugin::handles::HandleTable;
use crate::plugin::{self, Kind, Plugin, HANDLE_SIZE, MAX_RECVS};
use crate::transport::Region;
use once_cell::sync::{Lazy, OnceCell};
use parking_lot::Mutex;
use std::os::raw::{c_int, c_void};

pub(crate) type Res = c_int;
pub(crate) type Logger = Option<NcclLogger>;
pub(crate) type VoidP = *mut c_void;
pub(crate) type VoidPP = *mut *mut c_void;

pub(crate) fn plugin() -> Result<&'static Plugin> {
    plugin::global()
}

/// Where an entry point shared by NCCL's and Neuron's tables finds its plugin: the slots with
/// the same signature and meaning in both are one generic function.
pub(crate) trait Source {
    fn plugin() -> Result<&'static Plugin>;
}

/// NCCL's tables: the process-wide NCCL plugin.
pub(crate) struct Nccl;

impl Source for Nccl {
    fn plugin() -> Result<&'static Plugin> {
        plugin()
    }
}

/// v11+ per-communicator contexts that `init` handed out and `finalize` has not closed.
static CONTEXTS: Lazy<Mutex<HandleTable<()>>> = Lazy::new(Default::default);

pub(crate) fn init_common(logger: Logger) -> Result<()> {
    logging::init(logger);
    let p = plugin()?;
    log::info!(
        "fabricoll {} net plugin: provider {}, {} device(s), libfabric {}",
        env!("CARGO_PKG_VERSION"),
        p.provider,
        p.devices.len(),
        crate::transport::fabric::runtime_version()
    );
    Ok(())
}

/// The context of the versions before v11, which have none: made on first use, never closed.
pub(crate) fn legacy_context() -> VoidP {
    static LEGACY: OnceCell<u64> = OnceCell::new();
    let c = *LEGACY.get_or_init(|| {
        let c = plugin::new_handle(0, Kind::Ctx);
        CONTEXTS.lock().insert_at(c, ());
        c
    });
    ptr(Some(c))
}

pub(crate) fn new_context(ctx: &Out<VoidP>) -> Result<()> {
    init_common(None)?;
    let c = plugin::new_handle(0, Kind::Ctx);
    CONTEXTS.lock().insert_at(c, ());
    ctx.set(c as usize as VoidP);
    Ok(())
}

pub(crate) fn check_context(ctx: VoidP) -> Result<()> {
    if CONTEXTS.lock().contains(h(ctx)) {
        Ok(())
    } else {
        Err(Error::arg(
            "ctx",
            "not a context returned by init (or already finalized)",
        ))
    }
}

pub(crate) fn finalize_context(ctx: VoidP) -> Result<()> {
    if CONTEXTS.lock().remove(h(ctx)).is_some() {
        Ok(())
    } else {
        Err(Error::arg(
            "ctx",
            "not a context returned by init (or already finalized)",
        ))
    }
}

pub(crate) fn handle_bytes<'a>(handle: VoidP) -> Result<&'a mut [u8; HANDLE_SIZE]> {
    non_null(handle, "handle")?;
    // SAFETY: NCCL passes a buffer of NCCL_NET_HANDLE_MAXSIZE (128) bytes, owned by the caller
    // for the duration of the call; [u8; 128] has alignment 1.
    Ok(unsafe { &mut *(handle as *mut [u8; HANDLE_SIZE]) })
}

pub(crate) fn listen_inner(p: &Plugin, dev: c_int, handle: VoidP, out: &Out<VoidP>) -> Result<()> {
    let bytes = handle_bytes(handle)?;
    let (hb, l) = p.device(dev)?.listen()?;
    *bytes = hb;
    out.set(ptr(Some(l)));
    Ok(())
}

pub(crate) fn connect_inner(
    p: &Plugin,
    dev: c_int,
    handle: VoidP,
    out: &Out<VoidP>,
    dev_comm: VoidPP,
) -> Result<()> {
    // SAFETY: a non-NULL devComm out-pointer is writable per the ABI; a host plugin has none.
    if let Some(d) = unsafe { Out::optional(dev_comm) } {
        d.set(std::ptr::null_mut());
    }
    let c = p.device(dev)?.connect(handle_bytes(handle)?)?;
    out.set(ptr(c));
    Ok(())
}

pub(crate) fn accept_inner(
    p: &Plugin,
    listen: VoidP,
    out: &Out<VoidP>,
    dev_comm: VoidPP,
) -> Result<()> {
    // SAFETY: as in `connect_inner`.
    if let Some(d) = unsafe { Out::optional(dev_comm) } {
        d.set(std::ptr::null_mut());
    }
    let l = h(listen);
    let c = p.device_of(l, Kind::Listen, "listenComm")?.accept(l)?;
    out.set(ptr(c));
    Ok(())
}

/// The device of a send or receive comm.
pub(crate) fn comm_device(p: &Plugin, comm: VoidP) -> Result<&plugin::net::Device> {
    let c = h(comm);
    p.device_of(c, Kind::Send, "comm")
        .or_else(|_| p.device_of(c, Kind::Recv, "comm"))
}

/// A size argument: `int` in the older versions (negative is an error naming it), else `size_t`.
pub(crate) trait AbiSize: Copy {
    fn to_usize(self, name: &str) -> Result<usize>;
}

impl AbiSize for c_int {
    fn to_usize(self, name: &str) -> Result<usize> {
        int_size(self, name)
    }
}

impl AbiSize for usize {
    #[inline]
    fn to_usize(self, _name: &str) -> Result<usize> {
        Ok(self)
    }
}

pub(crate) fn reg_mr_inner(
    p: &Plugin,
    comm: VoidP,
    data: VoidP,
    size: usize,
    ty: c_int,
    out: &Out<VoidP>,
) -> Result<()> {
    // SAFETY: NCCL keeps registered memory allocated until deregMr.
    let r = unsafe { region(data, size, "data") }?;
    out.set(ptr(Some(comm_device(p, comm)?.reg_mr(h(comm), r, ty)?)));
    Ok(())
}

pub(crate) fn isend_inner(
    p: &Plugin,
    comm: VoidP,
    data: VoidP,
    size: usize,
    tag: c_int,
    mh: VoidP,
    out: &Out<VoidP>,
) -> Result<()> {
    // SAFETY: NCCL keeps the buffer valid until test() reports the request done.
    let r = unsafe { region(data, size, "data") }?;
    let c = h(comm);
    let req = p
        .device_of(c, Kind::Send, "sendComm")?
        .isend(c, r, tag, h(mh))?;
    out.set(ptr(req));
    Ok(())
}

/// Receive buffers from NCCL's parallel arrays (`S` is int for v6-v8, size_t for v9+).
///
/// # Safety
/// Each array has `n` readable elements when `n` is in 1..=MAX_RECVS (checked before reading);
/// each data pointer is valid for its size until the request completes.
pub(crate) unsafe fn recv_bufs<S: Copy + TryInto<usize> + std::fmt::Display>(
    n: c_int,
    data: VoidPP,
    sizes: *const S,
    tags: *const c_int,
    mhandles: VoidPP,
) -> Result<Vec<(Region, c_int, u64)>> {
    if n < 1 || n as usize > MAX_RECVS {
        return Err(Error::arg(
            "n",
            format!("{n} is outside 1..={MAX_RECVS} (maxRecvs)"),
        ));
    }
    for (p, name) in [
        (data as *const u8, "data"),
        (sizes as *const u8, "sizes"),
        (tags as *const u8, "tags"),
    ] {
        non_null(p, name)?;
    }
    let mut v = Vec::with_capacity(n as usize);
    for i in 0..n as usize {
        // SAFETY: i < n and the arrays have n elements (this function's contract).
        let (d, s, t) = unsafe { (*data.add(i), *sizes.add(i), *tags.add(i)) };
        let m = if mhandles.is_null() {
            std::ptr::null_mut()
        } else {
            // SAFETY: as above; mhandles may be NULL as a whole, and is not here.
            unsafe { *mhandles.add(i) }
        };
        let s: usize = s
            .try_into()
            .map_err(|_| Error::arg("sizes", format!("{s} is negative")))?;
        // SAFETY: forwarded from the contract.
        v.push((unsafe { region(d, s, "data") }?, t, h(m)));
    }
    Ok(v)
}

pub(crate) fn irecv_inner(
    p: &Plugin,
    comm: VoidP,
    bufs: Result<Vec<(Region, c_int, u64)>>,
    out: &Out<VoidP>,
) -> Result<()> {
    let bufs = bufs?;
    let c = h(comm);
    let req = p.device_of(c, Kind::Recv, "recvComm")?.irecv(c, &bufs)?;
    out.set(ptr(req));
    Ok(())
}

pub(crate) fn write_props<T: for<'a> From<&'a plugin::DeviceProps>>(
    p: &Plugin,
    dev: c_int,
    props: *mut T,
) -> Result<()> {
    // SAFETY: NCCL passes a writable props struct of this version's layout.
    let out = unsafe { Out::new(props, "props") }?;
    out.set(T::from(&p.device(dev)?.props));
    Ok(())
}

/// `test`: `done` is 1 once the request finished, and then `sizes` (NULL, or one int for a
/// send, one per buffer for a receive) holds the sizes.
pub(crate) fn test_inner(
    p: &Plugin,
    request: VoidP,
    done: *mut c_int,
    sizes: *mut c_int,
) -> Result<()> {
    // SAFETY: the caller passes a writable int*.
    let done = unsafe { Out::new(done, "done") }?;
    done.set(0);
    let r = h(request);
    let Some(f) = p.device_of(r, Kind::Request, "request")?.test(r)? else {
        return Ok(());
    };
    if !sizes.is_null() {
        for (i, s) in f.sizes.iter().take(f.n).enumerate() {
            // SAFETY: for a send the caller passes one int, for a receive an int per buffer (f.n
            // of them, n <= maxRecvs); sizes fit an int because transfers are <= maxP2pBytes.
            unsafe { sizes.add(i).write(*s as c_int) };
        }
    }
    done.set(1);
    Ok(())
}

// ---- the newest entry points (each runs inside the panic boundary) --------------------------

pub(crate) unsafe extern "C" fn init_v11(
    ctx: VoidPP,
    _comm_id: u64,
    _config: VoidP,
    logger: Logger,
    _prof: VoidP,
) -> Res {
    boundary("init", || {
        logging::init(logger);
        // SAFETY: NCCL passes a writable void** for the context.
        new_context(&unsafe { Out::new(ctx, "ctx") }?)
    })
}

pub(crate) unsafe extern "C" fn finalize(ctx: VoidP) -> Res {
    boundary("finalize", || finalize_context(ctx))
}

pub(crate) unsafe extern "C" fn devices<S: Source>(ndev: *mut c_int) -> Res {
    boundary("devices", || {
        // SAFETY: the caller passes a writable int*.
        let out = unsafe { Out::new(ndev, "ndev") }?;
        out.set(S::plugin()?.devices.len() as c_int);
        Ok(())
    })
}

/// Every version's getProperties: `P` is that version's props struct.
pub(crate) unsafe extern "C" fn get_properties<
    S: Source,
    P: for<'a> From<&'a plugin::DeviceProps>,
>(
    dev: c_int,
    props: *mut P,
) -> Res {
    boundary("getProperties", || write_props(S::plugin()?, dev, props))
}

unsafe extern "C" fn listen(ctx: VoidP, dev: c_int, handle: VoidP, listen_comm: VoidPP) -> Res {
    boundary("listen", || {
        check_context(ctx)?;
        // SAFETY: NCCL passes a writable void* out-pointer.
        listen_inner(plugin()?, dev, handle, &unsafe {
            Out::new(listen_comm, "listenComm")
        }?)
    })
}

unsafe extern "C" fn connect(
    ctx: VoidP,
    dev: c_int,
    handle: VoidP,
    send_comm: VoidPP,
    dev_comm: VoidPP,
) -> Res {
    boundary("connect", || {
        check_context(ctx)?;
        // SAFETY: NCCL passes a writable void* out-pointer.
        connect_inner(
            plugin()?,
            dev,
            handle,
            &unsafe { Out::new(send_comm, "sendComm") }?,
            dev_comm,
        )
    })
}

unsafe extern "C" fn accept(listen_comm: VoidP, recv_comm: VoidPP, dev_comm: VoidPP) -> Res {
    boundary("accept", || {
        // SAFETY: NCCL passes a writable void* out-pointer.
        accept_inner(
            plugin()?,
            listen_comm,
            &unsafe { Out::new(recv_comm, "recvComm") }?,
            dev_comm,
        )
    })
}

/// regMr; `S` is the size's width (int before v8).
unsafe extern "C" fn reg_mr<S: AbiSize>(
    comm: VoidP,
    data: VoidP,
    size: S,
    ty: c_int,
    mh: VoidPP,
) -> Res {
    boundary("regMr", || {
        // SAFETY: NCCL passes a writable void* out-pointer.
        let out = unsafe { Out::new(mh, "mhandle") }?;
        reg_mr_inner(plugin()?, comm, data, size.to_usize("size")?, ty, &out)
    })
}

/// regMrDmaBuf (v6 on): a buffer NCCL names by the dma-buf that exports it.
pub(crate) unsafe extern "C" fn reg_mr_dmabuf(
    comm: VoidP,
    data: VoidP,
    size: usize,
    ty: c_int,
    off: u64,
    fd: c_int,
    mh: VoidPP,
) -> Res {
    boundary("regMrDmaBuf", || {
        // SAFETY: NCCL passes a writable void* out-pointer.
        let out = unsafe { Out::new(mh, "mhandle") }?;
        reg_mr_dmabuf_inner(plugin()?, comm, data, size, ty, (off, fd), &out)
    })
}

/// `reg_mr_inner` for a dma-buf (`dmabuf`: offset and fd).
fn reg_mr_dmabuf_inner(
    p: &Plugin,
    comm: VoidP,
    data: VoidP,
    size: usize,
    ty: c_int,
    (off, fd): (u64, c_int),
    out: &Out<VoidP>,
) -> Result<()> {
    // SAFETY: NCCL keeps registered memory allocated until deregMr.
    let r = unsafe { region(data, size, "data") }?;
    let mh = comm_device(p, comm)?.reg_mr_dmabuf(h(comm), r, ty, off, fd)?;
    out.set(ptr(Some(mh)));
    Ok(())
}

unsafe extern "C" fn dereg_mr(comm: VoidP, mh: VoidP) -> Res {
    boundary("deregMr", || {
        comm_device(plugin()?, comm)?.dereg_mr(h(comm), h(mh))
    })
}

/// isend; `S` is the size's width (int before v9).
unsafe extern "C" fn isend<S: AbiSize>(
    comm: VoidP,
    data: VoidP,
    size: S,
    tag: c_int,
    mh: VoidP,
    _ph: VoidP,
    req: VoidPP,
) -> Res {
    boundary("isend", || {
        // SAFETY: NCCL passes a writable void* out-pointer.
        let out = unsafe { Out::new(req, "request") }?;
        out.set(std::ptr::null_mut());
        isend_inner(plugin()?, comm, data, size.to_usize("size")?, tag, mh, &out)
    })
}

/// irecv; `S` is the width of the sizes (int before v9).
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn irecv<S: Copy + TryInto<usize> + std::fmt::Display>(
    comm: VoidP,
    n: c_int,
    data: VoidPP,
    sizes: *mut S,
    tags: *mut c_int,
    mhs: VoidPP,
    _phs: VoidPP,
    req: VoidPP,
) -> Res {
    boundary("irecv", || {
        // SAFETY: NCCL passes a writable void* out-pointer (it may hold the 0x1 hint: overwritten).
        let out = unsafe { Out::new(req, "request") }?;
        out.set(std::ptr::null_mut());
        // SAFETY: NCCL's arrays have n elements; buffers live until test() reports done.
        irecv_inner(
            plugin()?,
            comm,
            unsafe { recv_bufs(n, data, sizes, tags, mhs) },
            &out,
        )
    })
}

pub(crate) unsafe extern "C" fn iflush<S: Source>(
    comm: VoidP,
    n: c_int,
    data: VoidPP,
    sizes: *mut c_int,
    mhs: VoidPP,
    req: VoidPP,
) -> Res {
    // SAFETY: the caller's arrays have n elements; the out-pointer is writable.
    boundary("iflush", || unsafe {
        iflush_inner(S::plugin()?, comm, n, data, sizes, mhs, req)
    })
}

/// `iflush`: the same arrays as the receive being flushed, validated the same way.
///
/// # Safety
/// `req` is NULL or writable; the arrays have `n` elements (checked against MAX_RECVS first).
pub(crate) unsafe fn iflush_inner(
    p: &Plugin,
    comm: VoidP,
    n: c_int,
    data: VoidPP,
    sizes: *mut c_int,
    mhs: VoidPP,
    req: VoidPP,
) -> Result<()> {
    // SAFETY: forwarded from this function's contract.
    let out = unsafe { Out::new(req, "request") }?;
    out.set(std::ptr::null_mut());
    let tags = [0 as c_int; MAX_RECVS];
    // SAFETY: forwarded from this function's contract.
    let bufs = unsafe { recv_bufs(n, data, sizes, tags.as_ptr(), mhs) }?;
    let c = h(comm);
    let r = p.device_of(c, Kind::Recv, "recvComm")?.iflush(c, &bufs)?;
    out.set(ptr(r));
    Ok(())
}

pub(crate) unsafe extern "C" fn test<S: Source>(
    request: VoidP,
    done: *mut c_int,
    sizes: *mut c_int,
) -> Res {
    boundary("test", || test_inner(S::plugin()?, request, done, sizes))
}

unsafe extern "C" fn close_send(comm: VoidP) -> Res {
    boundary("closeSend", || close_send_inner(comm))
}

pub(crate) fn close_send_inner(comm: VoidP) -> Result<()> {
    let c = h(comm);
    plugin()?
        .device_of(c, Kind::Send, "sendComm")?
        .close_send(c)
}

unsafe extern "C" fn close_recv(comm: VoidP) -> Res {
    boundary("closeRecv", || close_recv_inner(comm))
}

pub(crate) fn close_recv_inner(comm: VoidP) -> Result<()> {
    let c = h(comm);
    plugin()?
        .device_of(c, Kind::Recv, "recvComm")?
        .close_recv(c)
}

unsafe extern "C" fn close_listen(comm: VoidP) -> Res {
    boundary("closeListen", || {
        let c = h(comm);
        plugin()?
            .device_of(c, Kind::Listen, "listenComm")?
            .close_listen(c)
    })
}

unsafe extern "C" fn set_net_attr(ctx: VoidP, attr: VoidP) -> Res {
    boundary("setNetAttr", || {
        check_context(ctx)?;
        non_null(attr, "netAttr")?;
        // Hints only (concurrency and the operation mix); NCCL allows ignoring them.
        Ok(())
    })
}
