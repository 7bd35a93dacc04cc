//! `ncclCollNetPlugin_v6` ... `ncclCollNetPlugin_v12`: v12 native, older versions thin shims
//! (argument widths: int sizes and counts up to v8, 32-bit SGE sizes in v8; v6/v7 have no
//! iallgather/ireducescatter; v11+ take a context). Each export checks its pointers and makes
//! one call into `plugin::collnet`, inside the panic boundary.
// The table statics carry NCCL's symbol names (unexported in the Neuron flavour).
#![allow(non_upper_case_globals)]
use super::net::{
    check_context, devices, finalize, handle_bytes, init_v6, legacy_context, new_context, plugin,
    reg_mr_dmabuf, AbiSize, FClose, FDevices, FMakeVDevice, FRegDmaBuf, FTest, Logger, Nccl, Res,
    VoidP, VoidPP,
};
use super::types::*;
use super::{boundary, h, int_size, non_null, ptr, region, Out};
use crate::error::{Error, Result};
use crate::ffi::logging;
use crate::plugin::collnet;
use crate::transport::Region;
use std::os::raw::{c_char, c_int};

/// `ncclNetSGE_v8_t`: 32-bit size.
#[repr(C)]
pub struct SgeV8 {
    pub mhandle: VoidP,
    pub address: VoidP,
    pub size: u32,
}

/// `ncclNetSGE_v9_t` and later: size_t size.
#[repr(C)]
pub struct SgeV9 {
    pub mhandle: VoidP,
    pub address: VoidP,
    pub size: usize,
}

const _: () = {
    assert!(std::mem::size_of::<SgeV8>() == 24 && std::mem::size_of::<SgeV9>() == 24);
};

/// `getProperties`: the net plugin's device, device memory where it takes it (`collnet::props`).
unsafe extern "C" fn get_properties<P: for<'a> From<&'a crate::plugin::DeviceProps>>(
    dev: c_int,
    props: *mut P,
) -> Res {
    boundary("collnet getProperties", || {
        // SAFETY: NCCL passes a writable props struct of this version's layout.
        let out = unsafe { Out::new(props, "props") }?;
        out.set(P::from(collnet::props(plugin()?, dev)?));
        Ok(())
    })
}

trait Sge {
    fn parts(&self) -> (VoidP, usize);
}

impl Sge for SgeV8 {
    fn parts(&self) -> (VoidP, usize) {
        (self.address, self.size as usize)
    }
}

impl Sge for SgeV9 {
    fn parts(&self) -> (VoidP, usize) {
        (self.address, self.size)
    }
}

/// # Safety
/// `sges` points to `n` readable entries whose buffers stay valid until the request completes.
unsafe fn sge_regions<S: Sge>(n: c_int, sges: *const S, name: &str) -> Result<Vec<Region>> {
    if !(1..=64).contains(&n) {
        return Err(Error::arg(name, format!("{n} parts (1..=64 accepted)")));
    }
    non_null(sges, name)?;
    (0..n as usize)
        .map(|i| {
            // SAFETY: i < n, and the caller promised n entries.
            let (p, len) = unsafe { &*sges.add(i) }.parts();
            // SAFETY: forwarded from this function's contract.
            unsafe { region(p, len, name) }
        })
        .collect()
}

/// This rank's part of a window at `p` (NULL: none), exactly as long as its share.
fn share_region(
    comm: VoidP,
    p: VoidP,
    bpr: usize,
    off: usize,
    len: usize,
    name: &str,
) -> Result<Option<Region>> {
    if p.is_null() {
        return Ok(None);
    }
    let bytes = collnet::own_share(h(comm), bpr, off, len)?;
    // SAFETY: NCCL passes a buffer holding this rank's part of the window, valid until the
    // request completes.
    Ok(Some(unsafe { region(p, bytes, name) }?))
}

fn listen(dev: c_int, handle: VoidP, out: &Out<VoidP>) -> Result<()> {
    let bytes = handle_bytes(handle)?;
    let (hb, l) = collnet::listen(plugin()?, dev)?;
    *bytes = hb;
    out.set(ptr(Some(l)));
    Ok(())
}

unsafe extern "C" fn init_v11(ctx: VoidPP, _comm_id: u64, logger: Logger) -> Res {
    boundary("collnet init", || {
        logging::init(logger);
        // SAFETY: NCCL passes a writable void** for the context.
        new_context(&unsafe { Out::new(ctx, "ctx") }?)
    })
}

unsafe extern "C" fn listen_v6(dev: c_int, handle: VoidP, listen_comm: VoidPP) -> Res {
    // SAFETY: forwarded; the versions before v11 have the legacy context.
    unsafe { listen_v11(legacy_context(), dev, handle, listen_comm) }
}

unsafe extern "C" fn listen_v11(ctx: VoidP, dev: c_int, handle: VoidP, listen_comm: VoidPP) -> Res {
    boundary("collnet listen", || {
        check_context(ctx)?;
        // SAFETY: NCCL passes a writable void* out-pointer.
        listen(dev, handle, &unsafe {
            Out::new(listen_comm, "listenComm")
        }?)
    })
}

unsafe extern "C" fn connect(
    handles: VoidPP,
    nranks: c_int,
    rank: c_int,
    listen_comm: VoidP,
    coll_comm: VoidPP,
) -> Res {
    boundary("collnet connect", || {
        // SAFETY: NCCL passes a writable void* out-pointer.
        let out = unsafe { Out::new(coll_comm, "collComm") }?;
        out.set(std::ptr::null_mut());
        non_null(handles, "handles")?;
        let n = usize::try_from(nranks)
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| Error::arg("nranks", format!("{nranks} is not positive")))?;
        let r =
            usize::try_from(rank).map_err(|_| Error::arg("rank", format!("{rank} is negative")))?;
        let mut hs = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: NCCL passes an array of nranks handle pointers.
            let p = unsafe { *handles.add(i) };
            hs.push(*handle_bytes(p)?);
        }
        let c = collnet::connect(&hs, r, h(listen_comm), crate::config::get()?)?;
        out.set(ptr(Some(c)));
        Ok(())
    })
}

unsafe extern "C" fn reduce_support(dtype: c_int, op: c_int, supported: *mut c_int) -> Res {
    boundary("collnet reduceSupport", || {
        // SAFETY: NCCL passes a writable int*.
        unsafe { Out::new(supported, "supported") }?
            .set(collnet::reduce_support(dtype, op) as c_int);
        Ok(())
    })
}

fn reg(comm: VoidP, data: VoidP, size: usize, ty: c_int, mh: VoidPP) -> Result<()> {
    // SAFETY: NCCL passes a writable void* out-pointer.
    let out = unsafe { Out::new(mh, "mhandle") }?;
    out.set(std::ptr::null_mut());
    // SAFETY: NCCL keeps registered memory allocated until deregMr.
    let r = unsafe { region(data, size, "data") }?;
    out.set(ptr(Some(collnet::reg_mr(h(comm), r, ty)?)));
    Ok(())
}

/// regMr; `S` is the size's width (int before v8).
unsafe extern "C" fn reg_mr<S: AbiSize>(
    comm: VoidP,
    data: VoidP,
    size: S,
    ty: c_int,
    mh: VoidPP,
) -> Res {
    boundary("collnet regMr", || {
        reg(comm, data, size.to_usize("size")?, ty, mh)
    })
}

unsafe extern "C" fn dereg_mr(comm: VoidP, mh: VoidP) -> Res {
    boundary("collnet deregMr", || collnet::dereg_mr(h(comm), h(mh)))
}

#[allow(clippy::too_many_arguments)]
fn allreduce(
    comm: VoidP,
    send: VoidP,
    recv: VoidP,
    count: usize,
    dt: c_int,
    op: c_int,
    req: VoidPP,
) -> Result<()> {
    // SAFETY: NCCL passes a writable void* out-pointer.
    let out = unsafe { Out::new(req, "request") }?;
    out.set(std::ptr::null_mut());
    let el = crate::reduce::DataType::from_nccl(dt).map_or(1, |d| d.size());
    let bytes = count
        .checked_mul(el)
        .ok_or_else(|| Error::arg("count", "overflows"))?;
    // SAFETY: NCCL keeps both buffers valid until test() reports the request done.
    let (s, r) = unsafe {
        (
            region(send, bytes, "sendData")?,
            region(recv, bytes, "recvData")?,
        )
    };
    out.set(ptr(Some(collnet::iallreduce(
        h(comm),
        s,
        r,
        count,
        dt,
        op,
    )?)));
    Ok(())
}

/// iallreduce; `S` is the count's width (int before v9).
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn iallreduce<S: AbiSize>(
    comm: VoidP,
    send: VoidP,
    recv: VoidP,
    count: S,
    dt: c_int,
    op: c_int,
    _smh: VoidP,
    _rmh: VoidP,
    req: VoidPP,
) -> Res {
    boundary("collnet iallreduce", || {
        allreduce(comm, send, recv, count.to_usize("count")?, dt, op, req)
    })
}

#[allow(clippy::too_many_arguments)]
fn allgather<S: Sge>(
    comm: VoidP,
    send: VoidP,
    n: c_int,
    parts: *const S,
    bpr: usize,
    off: usize,
    len: usize,
    req: VoidPP,
) -> Result<()> {
    // SAFETY: NCCL passes a writable void* out-pointer.
    let out = unsafe { Out::new(req, "request") }?;
    out.set(std::ptr::null_mut());
    // SAFETY: NCCL passes n parts that stay valid until the request completes.
    let parts = unsafe { sge_regions(n, parts, "recvParts") }?;
    let send = share_region(comm, send, bpr, off, len, "sendData")?;
    out.set(ptr(Some(collnet::iallgather(
        h(comm),
        send,
        parts,
        bpr,
        off,
        len,
    )?)));
    Ok(())
}

/// iallgather; `S` is the version's SGE (32-bit sizes in v8).
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn iallgather<S: Sge>(
    comm: VoidP,
    send: VoidP,
    n: c_int,
    parts: *mut S,
    bpr: usize,
    off: usize,
    len: usize,
    _smh: VoidP,
    req: VoidPP,
) -> Res {
    boundary("collnet iallgather", || {
        allgather(comm, send, n, parts, bpr, off, len, req)
    })
}

#[allow(clippy::too_many_arguments)]
fn reducescatter<S: Sge>(
    comm: VoidP,
    n: c_int,
    parts: *const S,
    recv: VoidP,
    bpr: usize,
    off: usize,
    len: usize,
    dt: c_int,
    op: c_int,
    req: VoidPP,
) -> Result<()> {
    // SAFETY: NCCL passes a writable void* out-pointer.
    let out = unsafe { Out::new(req, "request") }?;
    out.set(std::ptr::null_mut());
    // SAFETY: NCCL passes n parts that stay valid until the request completes.
    let parts = unsafe { sge_regions(n, parts, "sendParts") }?;
    let recv = share_region(comm, recv, bpr, off, len, "recvData")?;
    out.set(ptr(Some(collnet::ireducescatter(
        h(comm),
        parts,
        recv,
        bpr,
        off,
        len,
        dt,
        op,
    )?)));
    Ok(())
}

/// ireducescatter; `S` is the version's SGE (32-bit sizes in v8).
#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn ireducescatter<S: Sge>(
    comm: VoidP,
    n: c_int,
    parts: *mut S,
    recv: VoidP,
    bpr: usize,
    off: usize,
    len: usize,
    dt: c_int,
    op: c_int,
    _rmh: VoidP,
    req: VoidPP,
) -> Res {
    boundary("collnet ireducescatter", || {
        reducescatter(comm, n, parts, recv, bpr, off, len, dt, op, req)
    })
}

unsafe extern "C" fn iflush(
    comm: VoidP,
    _data: VoidP,
    size: c_int,
    _mh: VoidP,
    req: VoidPP,
) -> Res {
    boundary("collnet iflush", || {
        // SAFETY: NCCL passes a writable void* out-pointer.
        let out = unsafe { Out::new(req, "request") }?;
        out.set(std::ptr::null_mut());
        // Nothing to flush; the request is complete at once (NULL). Host memory needs none,
        // and a device buffer's results were written by a copy engine whose completion the
        // operation's `test` waited for (no NIC wrote to the device).
        int_size(size, "size")?;
        collnet::check_comm(h(comm))
    })
}

unsafe extern "C" fn test(request: VoidP, done: *mut c_int, size: *mut c_int) -> Res {
    boundary("collnet test", || {
        // SAFETY: NCCL passes a writable int*.
        let done = unsafe { Out::new(done, "done") }?;
        done.set(0);
        if let Some(bytes) = collnet::test(h(request))? {
            // SAFETY: a non-NULL size is a writable int; bytes <= maxCollBytes fit.
            if let Some(size) = unsafe { Out::optional(size) } {
                size.set(bytes as c_int);
            }
            done.set(1);
        }
        Ok(())
    })
}

unsafe extern "C" fn close_coll(comm: VoidP) -> Res {
    boundary("collnet closeColl", || collnet::close_coll(h(comm)))
}

unsafe extern "C" fn close_listen(comm: VoidP) -> Res {
    boundary("collnet closeListen", || collnet::close_listen(h(comm)))
}

// ---- the tables ---------------------------------------------------------------------------

type FConnect = unsafe extern "C" fn(VoidPP, c_int, c_int, VoidP, VoidPP) -> Res;
type FSupport = unsafe extern "C" fn(c_int, c_int, *mut c_int) -> Res;
type FDereg = unsafe extern "C" fn(VoidP, VoidP) -> Res;
type FFlush = unsafe extern "C" fn(VoidP, VoidP, c_int, VoidP, VoidPP) -> Res;
type FAllreduceInt =
    unsafe extern "C" fn(VoidP, VoidP, VoidP, c_int, c_int, c_int, VoidP, VoidP, VoidPP) -> Res;
type FAllreduceSize =
    unsafe extern "C" fn(VoidP, VoidP, VoidP, usize, c_int, c_int, VoidP, VoidP, VoidPP) -> Res;
type FRegInt = unsafe extern "C" fn(VoidP, VoidP, c_int, c_int, VoidPP) -> Res;
type FRegSize = unsafe extern "C" fn(VoidP, VoidP, usize, c_int, VoidPP) -> Res;
type FListen6 = unsafe extern "C" fn(c_int, VoidP, VoidPP) -> Res;
type FListen11 = unsafe extern "C" fn(VoidP, c_int, VoidP, VoidPP) -> Res;
type FInit6 = unsafe extern "C" fn(Logger) -> Res;
type FInit11 = unsafe extern "C" fn(VoidPP, u64, Logger) -> Res;
type FAllgather<S> =
    unsafe extern "C" fn(VoidP, VoidP, c_int, *mut S, usize, usize, usize, VoidP, VoidPP) -> Res;
type FReduceScatter<S> = unsafe extern "C" fn(
    VoidP,
    c_int,
    *mut S,
    VoidP,
    usize,
    usize,
    usize,
    c_int,
    c_int,
    VoidP,
    VoidPP,
) -> Res;

macro_rules! collnet_table {
    ($name:ident { $($field:ident : $ty:ty),* $(,)? }) => {
        #[repr(C)]
        pub struct $name {
            pub name: *const c_char,
            $(pub $field: $ty,)*
        }
        // SAFETY: immutable static data: a pointer to a static string and fn pointers.
        unsafe impl Sync for $name {}
    };
}

collnet_table!(CollNetV6 {
    init: FInit6, devices: FDevices, get_properties: unsafe extern "C" fn(c_int, *mut PropsV6) -> Res, listen: FListen6, connect: FConnect,
    reduce_support: FSupport, reg_mr: FRegInt, reg_mr_dmabuf: FRegDmaBuf, dereg_mr: FDereg, iallreduce: FAllreduceInt, iflush: FFlush,
    test: FTest, close_coll: FClose, close_listen: FClose,
});
collnet_table!(CollNetV7 {
    init: FInit6, devices: FDevices, get_properties: unsafe extern "C" fn(c_int, *mut PropsV7) -> Res, listen: FListen6, connect: FConnect,
    reduce_support: FSupport, reg_mr: FRegInt, reg_mr_dmabuf: FRegDmaBuf, dereg_mr: FDereg, iallreduce: FAllreduceInt, iflush: FFlush,
    test: FTest, close_coll: FClose, close_listen: FClose,
});
collnet_table!(CollNetV8 {
    init: FInit6, devices: FDevices, get_properties: unsafe extern "C" fn(c_int, *mut PropsV8) -> Res, listen: FListen6, connect: FConnect,
    reduce_support: FSupport, reg_mr: FRegSize, reg_mr_dmabuf: FRegDmaBuf, dereg_mr: FDereg, iallreduce: FAllreduceInt,
    iallgather: FAllgather<SgeV8>, ireducescatter: FReduceScatter<SgeV8>, iflush: FFlush, test: FTest, close_coll: FClose, close_listen: FClose,
});
collnet_table!(CollNetV9 {
    init: FInit6, devices: FDevices, get_properties: unsafe extern "C" fn(c_int, *mut PropsV9) -> Res, listen: FListen6, connect: FConnect,
    reduce_support: FSupport, reg_mr: FRegSize, reg_mr_dmabuf: FRegDmaBuf, dereg_mr: FDereg, iallreduce: FAllreduceSize,
    iallgather: FAllgather<SgeV9>, ireducescatter: FReduceScatter<SgeV9>, iflush: FFlush, test: FTest, close_coll: FClose, close_listen: FClose,
    make_vdevice: FMakeVDevice<VDevPropsV9>,
});
collnet_table!(CollNetV11 {
    init: FInit11, devices: FDevices, get_properties: unsafe extern "C" fn(c_int, *mut PropsV11) -> Res, listen: FListen11, connect: FConnect,
    reduce_support: FSupport, reg_mr: FRegSize, reg_mr_dmabuf: FRegDmaBuf, dereg_mr: FDereg, iallreduce: FAllreduceSize,
    iallgather: FAllgather<SgeV9>, ireducescatter: FReduceScatter<SgeV9>, iflush: FFlush, test: FTest, close_coll: FClose, close_listen: FClose,
    make_vdevice: FMakeVDevice<VDevPropsV9>, finalize: FClose,
});
collnet_table!(CollNetV12 {
    init: FInit11, devices: FDevices, get_properties: unsafe extern "C" fn(c_int, *mut PropsV12) -> Res, listen: FListen11, connect: FConnect,
    reduce_support: FSupport, reg_mr: FRegSize, reg_mr_dmabuf: FRegDmaBuf, dereg_mr: FDereg, iallreduce: FAllreduceSize,
    iallgather: FAllgather<SgeV9>, ireducescatter: FReduceScatter<SgeV9>, iflush: FFlush, test: FTest, close_coll: FClose, close_listen: FClose,
    make_vdevice: FMakeVDevice<VDevPropsV12>, finalize: FClose,
});

const _: () = {
    use std::mem::size_of;
    assert!(size_of::<CollNetV6>() == 15 * 8 && size_of::<CollNetV7>() == 15 * 8);
    assert!(size_of::<CollNetV8>() == 17 * 8 && size_of::<CollNetV9>() == 18 * 8);
    assert!(size_of::<CollNetV11>() == 19 * 8 && size_of::<CollNetV12>() == 19 * 8);
};

const NAME: &std::ffi::CStr = c"fabricoll";

#[cfg_attr(not(feature = "neuron"), no_mangle)]
pub static ncclCollNetPlugin_v12: CollNetV12 = CollNetV12 {
    name: NAME.as_ptr(),
    init: init_v11,
    devices: devices::<Nccl>,
    get_properties: get_properties::<PropsV12>,
    listen: listen_v11,
    connect,
    reduce_support,
    reg_mr: reg_mr::<usize>,
    reg_mr_dmabuf,
    dereg_mr,
    iallreduce: iallreduce::<usize>,
    iallgather: iallgather::<SgeV9>,
    ireducescatter: ireducescatter::<SgeV9>,
    iflush,
    test,
    close_coll,
    close_listen,
    make_vdevice: None,
    finalize,
};

#[cfg_attr(not(feature = "neuron"), no_mangle)]
pub static ncclCollNetPlugin_v11: CollNetV11 = CollNetV11 {
    name: NAME.as_ptr(),
    init: init_v11,
    devices: devices::<Nccl>,
    get_properties: get_properties::<PropsV11>,
    listen: listen_v11,
    connect,
    reduce_support,
    reg_mr: reg_mr::<usize>,
    reg_mr_dmabuf,
    dereg_mr,
    iallreduce: iallreduce::<usize>,
    iallgather: iallgather::<SgeV9>,
    ireducescatter: ireducescatter::<SgeV9>,
    iflush,
    test,
    close_coll,
    close_listen,
    make_vdevice: None,
    finalize,
};

#[cfg_attr(not(feature = "neuron"), no_mangle)]
pub static ncclCollNetPlugin_v10: CollNetV9 = CollNetV9 {
    name: NAME.as_ptr(),
    init: init_v6,
    devices: devices::<Nccl>,
    get_properties: get_properties::<PropsV9>,
    listen: listen_v6,
    connect,
    reduce_support,
    reg_mr: reg_mr::<usize>,
    reg_mr_dmabuf,
    dereg_mr,
    iallreduce: iallreduce::<usize>,
    iallgather: iallgather::<SgeV9>,
    ireducescatter: ireducescatter::<SgeV9>,
    iflush,
    test,
    close_coll,
    close_listen,
    make_vdevice: None,
};

#[cfg_attr(not(feature = "neuron"), no_mangle)]
pub static ncclCollNetPlugin_v9: CollNetV9 = CollNetV9 {
    name: NAME.as_ptr(),
    init: init_v6,
    devices: devices::<Nccl>,
    get_properties: get_properties::<PropsV9>,
    listen: listen_v6,
    connect,
    reduce_support,
    reg_mr: reg_mr::<usize>,
    reg_mr_dmabuf,
    dereg_mr,
    iallreduce: iallreduce::<usize>,
    iallgather: iallgather::<SgeV9>,
    ireducescatter: ireducescatter::<SgeV9>,
    iflush,
    test,
    close_coll,
    close_listen,
    make_vdevice: None,
};

#[cfg_attr(not(feature = "neuron"), no_mangle)]
pub static ncclCollNetPlugin_v8: CollNetV8 = CollNetV8 {
    name: NAME.as_ptr(),
    init: init_v6,
    devices: devices::<Nccl>,
    get_properties: get_properties::<PropsV8>,
    listen: listen_v6,
    connect,
    reduce_support,
    reg_mr: reg_mr::<usize>,
    reg_mr_dmabuf,
    dereg_mr,
    iallreduce: iallreduce::<c_int>,
    iallgather: iallgather::<SgeV8>,
    ireducescatter: ireducescatter::<SgeV8>,
    iflush,
    test,
    close_coll,
    close_listen,
};

#[cfg_attr(not(feature = "neuron"), no_mangle)]
pub static ncclCollNetPlugin_v7: CollNetV7 = CollNetV7 {
    name: NAME.as_ptr(),
    init: init_v6,
    devices: devices::<Nccl>,
    get_properties: get_properties::<PropsV7>,
    listen: listen_v6,
    connect,
    reduce_support,
    reg_mr: reg_mr::<c_int>,
    reg_mr_dmabuf,
    dereg_mr,
    iallreduce: iallreduce::<c_int>,
    iflush,
    test,
    close_coll,
    close_listen,
};

#[cfg_attr(not(feature = "neuron"), no_mangle)]
pub static ncclCollNetPlugin_v6: CollNetV6 = CollNetV6 {
    name: NAME.as_ptr(),
    init: init_v6,
    devices: devices::<Nccl>,
    get_properties: get_properties::<PropsV6>,
    listen: listen_v6,
    connect,
    reduce_support,
    reg_mr: reg_mr::<c_int>,
    reg_mr_dmabuf,
    dereg_mr,
    iallreduce: iallreduce::<c_int>,
    iflush,
    test,
    close_coll,
    close_listen,
};
