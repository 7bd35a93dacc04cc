//! Neuron's v4 table where it differs from v5/v6: 64-byte handles, `connect` and `accept` that
//! block until the comm exists (deadline `FABRICOLL_TIMEOUT_MS`), and one buffer per call with
//! no tag (tag 0).
use super::lifecycle::plugin;
use super::{irecv, isend, Neuron};
use crate::error::{Error, Result};
use crate::ffi::net::Res;
use crate::ffi::net::{accept_inner, connect_inner, iflush, listen_inner, VoidP, VoidPP};
use crate::ffi::{boundary, h, non_null, Out};
use crate::plugin::{Kind, Plugin, HANDLE_SIZE};
use std::os::raw::c_int;
use std::time::{Duration, Instant};

/// v4's handle size (`NCCL_NET_HANDLE_MAXSIZE_V4`).
pub const HANDLE_SIZE_V4: usize = 64;

/// The caller's 64-byte v4 handle.
///
/// # Safety
/// `handle` is NULL or points to 64 bytes the caller owns for the duration of the call.
unsafe fn handle_v4<'a>(handle: VoidP) -> Result<&'a mut [u8; HANDLE_SIZE_V4]> {
    non_null(handle, "handle")?;
    // SAFETY: per this function's contract; [u8; 64] has alignment 1.
    Ok(unsafe { &mut *(handle as *mut [u8; HANDLE_SIZE_V4]) })
}

pub(super) unsafe extern "C" fn listen(dev: c_int, handle: VoidP, listen_comm: VoidPP) -> Res {
    boundary("listen", || {
        // SAFETY: libnccom passes a 64-byte handle and a writable void* out-pointer.
        let (handle, out) = unsafe { (handle_v4(handle)?, Out::new(listen_comm, "listenComm")?) };
        listen_v4(plugin()?, dev, handle, &out)
    })
}

/// listen, with the listener's address in the first 64 bytes of the handle or an error naming
/// the provider whose addresses do not fit (then no listen comm is left behind).
fn listen_v4(
    p: &Plugin,
    dev: c_int,
    handle: &mut [u8; HANDLE_SIZE_V4],
    out: &Out<VoidP>,
) -> Result<()> {
    let mut full = [0u8; HANDLE_SIZE];
    let mut l: VoidP = std::ptr::null_mut();
    // SAFETY: `l` is a local void*.
    listen_inner(p, dev, full.as_mut_ptr().cast(), &unsafe {
        Out::new(&mut l, "listenComm")
    }?)?;
    if full[HANDLE_SIZE_V4..].iter().any(|b| *b != 0) {
        let l = h(l);
        let _ = p
            .device_of(l, Kind::Listen, "listenComm")
            .and_then(|d| d.close_listen(l));
        return Err(Error::InvalidUsage(format!(
            "listen: the endpoint address of provider {} does not fit the {HANDLE_SIZE_V4}-byte \
             handle of ncclNet_v4 (use v5 or v6, or another provider)",
            p.provider
        )));
    }
    handle.copy_from_slice(&full[..HANDLE_SIZE_V4]);
    out.set(l);
    Ok(())
}

/// Call `step` until it yields a comm, within `FABRICOLL_TIMEOUT_MS`.
fn block_until(what: &str, mut step: impl FnMut(&Out<VoidP>) -> Result<()>) -> Result<VoidP> {
    let timeout = crate::config::get()?.timeout;
    let start = Instant::now();
    let mut c: VoidP = std::ptr::null_mut();
    // SAFETY: `c` is a local void*.
    let out = unsafe { Out::new(&mut c, what) }?;
    for i in 0u64.. {
        step(&out)?;
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

pub(super) unsafe extern "C" fn connect(dev: c_int, handle: VoidP, send_comm: VoidPP) -> Res {
    boundary("connect", || {
        // SAFETY: libnccom passes a 64-byte handle and a writable void* out-pointer.
        let (handle, out) = unsafe { (handle_v4(handle)?, Out::new(send_comm, "sendComm")?) };
        out.set(connect_v4(plugin()?, dev, handle)?);
        Ok(())
    })
}

/// connect to the listener of a 64-byte handle (zero-extended to the plugin's 128), blocking.
fn connect_v4(p: &Plugin, dev: c_int, handle: &[u8; HANDLE_SIZE_V4]) -> Result<VoidP> {
    let mut full = [0u8; HANDLE_SIZE];
    full[..HANDLE_SIZE_V4].copy_from_slice(handle);
    block_until("sendComm", |o| {
        connect_inner(p, dev, full.as_mut_ptr().cast(), o, std::ptr::null_mut())
    })
}

pub(super) unsafe extern "C" fn accept(listen_comm: VoidP, recv_comm: VoidPP) -> Res {
    boundary("accept", || {
        // SAFETY: libnccom passes a writable void* out-pointer.
        let out = unsafe { Out::new(recv_comm, "recvComm") }?;
        let p = plugin()?;
        out.set(block_until("recvComm", |o| {
            accept_inner(p, listen_comm, o, std::ptr::null_mut())
        })?);
        Ok(())
    })
}

/// isend without a tag (tag 0).
pub(super) unsafe extern "C" fn isend_v4(
    comm: VoidP,
    data: VoidP,
    size: c_int,
    mh: VoidP,
    req: VoidPP,
) -> Res {
    // SAFETY: forwarded.
    unsafe { isend(comm, data, size, 0, mh, req) }
}

/// irecv of one buffer, tag 0.
pub(super) unsafe extern "C" fn irecv_v4(
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

/// iflush of one buffer.
pub(super) unsafe extern "C" fn iflush_v4(
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
