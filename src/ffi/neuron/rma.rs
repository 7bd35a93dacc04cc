//! Neuron's RMA slots: `getMrKey`, `iwrite`, `iwriteInline` and `iread`. Where the provider offers
//! no RMA usable by virtual address (`rma_supported = 0`) each returns SystemError, as libnccom
//! expects of a plugin without RMA.
use super::lifecycle::plugin;
use super::{boundary, h, VoidP, VoidPP};
use crate::error::Result;
use crate::ffi::net::Res;
use crate::ffi::{non_null, ptr, region, Out};
use crate::plugin::Kind;

pub(super) unsafe extern "C" fn get_mr_key(mh: VoidP, key: *mut u64) -> Res {
    boundary("getMrKey", || {
        // SAFETY: libnccom passes a writable uint64_t*.
        let out = unsafe { Out::new(key, "mr_key") }?;
        let m = h(mh);
        out.set(plugin()?.device_of(m, Kind::Mr, "mhandle")?.mr_key(m)?);
        Ok(())
    })
}

/// iwrite (`write`) and iread: `local` on this side, `remote` (virtual address, key) on the
/// peer's.
///
/// # Safety
/// `req` is NULL or writable; `local` is NULL or valid for `size` bytes until the request is done.
unsafe fn rma(
    comm: VoidP,
    write: bool,
    local: VoidP,
    size: usize,
    mh: VoidP,
    remote: (u64, u64),
    req: VoidPP,
) -> Result<()> {
    // SAFETY: forwarded from this function's contract.
    let out = unsafe { Out::new(req, "request") }?;
    out.set(std::ptr::null_mut());
    let (kind, what, buf) = if write {
        (Kind::Send, "sComm", "src")
    } else {
        (Kind::Recv, "rComm", "dest")
    };
    // SAFETY: forwarded from this function's contract.
    let r = unsafe { region(local, size, buf) }?;
    let c = h(comm);
    let d = plugin()?.device_of(c, kind, what)?;
    out.set(ptr(d.rma_op(c, write, r, h(mh), remote.0, remote.1)?));
    Ok(())
}

pub(super) unsafe extern "C" fn iwrite(
    comm: VoidP,
    src: VoidP,
    size: usize,
    src_mh: VoidP,
    dest: u64,
    key: u64,
    req: VoidPP,
) -> Res {
    // SAFETY: libnccom keeps `src` valid until test() reports done; `req` is writable.
    boundary("iwrite", || unsafe {
        rma(comm, true, src, size, src_mh, (dest, key), req)
    })
}

pub(super) unsafe extern "C" fn iread(
    comm: VoidP,
    dest: VoidP,
    size: usize,
    dest_mh: VoidP,
    src: u64,
    key: u64,
    req: VoidPP,
) -> Res {
    // SAFETY: libnccom keeps `dest` valid until test() reports done; `req` is writable.
    boundary("iread", || unsafe {
        rma(comm, false, dest, size, dest_mh, (src, key), req)
    })
}

pub(super) unsafe extern "C" fn iwrite_inline(
    comm: VoidP,
    src: VoidP,
    size: usize,
    dest: u64,
    key: u64,
    req: VoidPP,
) -> Res {
    boundary("iwriteInline", || {
        // SAFETY: libnccom passes a writable void* out-pointer.
        let out = unsafe { Out::new(req, "request") }?;
        out.set(std::ptr::null_mut());
        let bytes: &[u8] = if size == 0 {
            &[]
        } else {
            non_null(src, "src")?;
            // SAFETY: `src` is readable for `size` bytes for the duration of the call (it is
            // copied out by the inject before we return).
            unsafe { std::slice::from_raw_parts(src as *const u8, size) }
        };
        let c = h(comm);
        let d = plugin()?.device_of(c, Kind::Send, "sComm")?;
        out.set(ptr(d.iwrite_inline(c, bytes, dest, key)?));
        Ok(())
    })
}
