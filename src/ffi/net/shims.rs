//! The functions of the versions before v11 whose signature differs from the newest: each one
//! converts its arguments (no context: the legacy one; no device comm or profiler handle: NULL)
//! and calls the newest entry point, which holds the panic boundary.
use super::*;

/// v6-v10 init: a context of its own, kept as the legacy context (a repeated init closes its new
/// one again, so that only one exists).
pub(crate) unsafe extern "C" fn init_v6(logger: Logger) -> Res {
    let mut ctx: VoidP = std::ptr::null_mut();
    // SAFETY: `ctx` is a writable void*.
    let r = unsafe {
        init_v11(
            &mut ctx,
            0,
            std::ptr::null_mut(),
            logger,
            std::ptr::null_mut(),
        )
    };
    if r == 0 && ctx != legacy_context() {
        // SAFETY: `ctx` came from init_v11 just above.
        unsafe { finalize(ctx) };
    }
    r
}

pub(crate) unsafe extern "C" fn init_v10(logger: Logger, _prof: VoidP) -> Res {
    // SAFETY: forwarded.
    unsafe { init_v6(logger) }
}

pub(crate) unsafe extern "C" fn listen_v6(dev: c_int, handle: VoidP, listen_comm: VoidPP) -> Res {
    // SAFETY: forwarded.
    unsafe { listen(legacy_context(), dev, handle, listen_comm) }
}

pub(crate) unsafe extern "C" fn connect_v6(dev: c_int, handle: VoidP, send_comm: VoidPP) -> Res {
    // SAFETY: forwarded; a NULL devComm is allowed.
    unsafe {
        connect(
            legacy_context(),
            dev,
            handle,
            send_comm,
            std::ptr::null_mut(),
        )
    }
}

pub(crate) unsafe extern "C" fn connect_v7(
    dev: c_int,
    handle: VoidP,
    send_comm: VoidPP,
    dev_comm: VoidPP,
) -> Res {
    // SAFETY: forwarded.
    unsafe { connect(legacy_context(), dev, handle, send_comm, dev_comm) }
}

pub(crate) unsafe extern "C" fn connect_v10(
    dev: c_int,
    _config: VoidP,
    handle: VoidP,
    send_comm: VoidPP,
    dev_comm: VoidPP,
) -> Res {
    // SAFETY: forwarded.
    unsafe { connect(legacy_context(), dev, handle, send_comm, dev_comm) }
}

pub(crate) unsafe extern "C" fn accept_v6(listen_comm: VoidP, recv_comm: VoidPP) -> Res {
    // SAFETY: forwarded; a NULL devComm is allowed.
    unsafe { accept(listen_comm, recv_comm, std::ptr::null_mut()) }
}

pub(crate) unsafe extern "C" fn isend_v6(
    comm: VoidP,
    data: VoidP,
    size: c_int,
    tag: c_int,
    mh: VoidP,
    req: VoidPP,
) -> Res {
    // SAFETY: forwarded; no profiler handle.
    unsafe { isend(comm, data, size, tag, mh, std::ptr::null_mut(), req) }
}

pub(crate) unsafe extern "C" fn isend_v9(
    comm: VoidP,
    data: VoidP,
    size: usize,
    tag: c_int,
    mh: VoidP,
    req: VoidPP,
) -> Res {
    // SAFETY: forwarded; no profiler handle.
    unsafe { isend(comm, data, size, tag, mh, std::ptr::null_mut(), req) }
}

pub(crate) unsafe extern "C" fn irecv_v6(
    comm: VoidP,
    n: c_int,
    data: VoidPP,
    sizes: *mut c_int,
    tags: *mut c_int,
    mhs: VoidPP,
    req: VoidPP,
) -> Res {
    // SAFETY: forwarded; no profiler handles.
    unsafe { irecv(comm, n, data, sizes, tags, mhs, std::ptr::null_mut(), req) }
}

pub(crate) unsafe extern "C" fn irecv_v9(
    comm: VoidP,
    n: c_int,
    data: VoidPP,
    sizes: *mut usize,
    tags: *mut c_int,
    mhs: VoidPP,
    req: VoidPP,
) -> Res {
    // SAFETY: forwarded; no profiler handles.
    unsafe { irecv(comm, n, data, sizes, tags, mhs, std::ptr::null_mut(), req) }
}
