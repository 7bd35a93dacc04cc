//! The v11 / v12 entry points that know NCCL's multi-request groups (`plugin::multi` holds the
//! groups and their rules): each reads NCCL's arguments, calls the plugin inside the panic
//! boundary and writes NCCL's out-arguments.
use super::super::types::MultiRequestProps;
use super::*;
use crate::plugin::multi::{self, Tested, MAX_GROUP};

/// `NCCL_NET_MULTI_REQUEST`: the `*request` value of a call that is not its group's last.
pub const NCCL_NET_MULTI_REQUEST: usize = 0x2;

/// NCCL's request out-pointer, set to NULL, and whether NCCL marked the call as a group member
/// (`*request` was NCCL_NET_MULTI_REQUEST; the 0x1 hint of irecv is not a group's and is
/// overwritten like any other value).
///
/// # Safety
/// `req` is NULL or readable and writable, as NCCL's `void**` request argument is.
unsafe fn request_arg(req: VoidPP) -> Result<(bool, Out<VoidP>)> {
    // SAFETY: forwarded from this function's contract.
    let hint = !req.is_null() && unsafe { *req } as usize == NCCL_NET_MULTI_REQUEST;
    // SAFETY: as above.
    let out = unsafe { Out::new(req, "request") }?;
    out.set(std::ptr::null_mut());
    Ok((hint, out))
}

pub(crate) unsafe extern "C" fn isend_v11(
    comm: VoidP,
    data: VoidP,
    size: usize,
    tag: c_int,
    mh: VoidP,
    _ph: VoidP,
    req: VoidPP,
) -> Res {
    boundary("isend", || {
        // SAFETY: NCCL's request argument is a readable and writable void*.
        let (hint, out) = unsafe { request_arg(req) }?;
        // SAFETY: NCCL keeps the buffer valid until test() reports the request done.
        let r = unsafe { region(data, size, "data") }?;
        out.set(ptr(multi::call(
            plugin()?,
            h(comm),
            true,
            vec![(r, tag, h(mh))],
            hint,
        )?));
        Ok(())
    })
}

#[allow(clippy::too_many_arguments)]
pub(crate) unsafe extern "C" fn irecv_v11(
    comm: VoidP,
    n: c_int,
    data: VoidPP,
    sizes: *mut usize,
    tags: *mut c_int,
    mhs: VoidPP,
    _phs: VoidPP,
    req: VoidPP,
) -> Res {
    boundary("irecv", || {
        // SAFETY: NCCL's request argument is a readable and writable void*.
        let (hint, out) = unsafe { request_arg(req) }?;
        // SAFETY: NCCL's arrays have n elements; buffers live until test() reports done.
        let bufs = unsafe { recv_bufs(n, data, sizes, tags, mhs) }?;
        out.set(ptr(multi::call(plugin()?, h(comm), false, bufs, hint)?));
        Ok(())
    })
}

pub(crate) unsafe extern "C" fn test_v11(
    request: VoidP,
    done: *mut c_int,
    sizes: *mut c_int,
) -> Res {
    boundary("test", || test_group(plugin()?, request, done, sizes))
}

/// `test` of the v11+ tables: a group's handle, else an ordinary request.
fn test_group(p: &Plugin, request: VoidP, done: *mut c_int, sizes: *mut c_int) -> Result<()> {
    // SAFETY: the caller passes a writable int*.
    let done_out = unsafe { Out::new(done, "done") }?;
    done_out.set(0);
    let (total, n) = match multi::test(p, h(request))? {
        Tested::Request => return test_inner(p, request, done, sizes),
        Tested::Pending => return Ok(()),
        Tested::Done { bytes, sizes } => (bytes, sizes),
    };
    if !sizes.is_null() {
        // The group's bytes (saturating at INT_MAX) in the first size, the rest 0. NCCL only
        // sums a request's sizes, and one int per member could overrun its array (64 ints; a
        // group has up to 128).
        for i in 0..n {
            let v = if i == 0 {
                total.min(c_int::MAX as usize) as c_int
            } else {
                0
            };
            // SAFETY: a send passes one int, a receive an int per buffer of the irecv that
            // returned this handle (n of them, at most maxRecvs).
            unsafe { sizes.add(i).write(v) };
        }
    }
    done_out.set(1);
    Ok(())
}

pub(crate) unsafe extern "C" fn close_send_v11(comm: VoidP) -> Res {
    boundary("closeSend", || {
        multi::forget_comm(h(comm), "closeSend");
        close_send_inner(comm)
    })
}

pub(crate) unsafe extern "C" fn close_recv_v11(comm: VoidP) -> Res {
    boundary("closeRecv", || {
        multi::forget_comm(h(comm), "closeRecv");
        close_recv_inner(comm)
    })
}

/// getProperties of the v11 / v12 net tables: the common props with [`MAX_GROUP`].
pub(crate) unsafe extern "C" fn get_properties_v11<P>(dev: c_int, props: *mut P) -> Res
where
    P: for<'a> From<&'a plugin::DeviceProps> + MultiRequestProps,
{
    boundary("getProperties", || {
        // SAFETY: NCCL passes a writable props struct of this version's layout.
        let out = unsafe { Out::new(props, "props") }?;
        let mut v = P::from(&plugin()?.device(dev)?.props);
        v.set_max_multi_request_size(MAX_GROUP as c_int);
        out.set(v);
        Ok(())
    })
}
