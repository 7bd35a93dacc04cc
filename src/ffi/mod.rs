//! The C ABI: NCCL's versioned tables and (later) the `fabricoll_*` API. Each export checks its
//! pointers, makes one call into safe Rust, and runs inside the panic boundary. No logic here.
pub mod api;
pub mod collnet;
pub mod net;
pub mod types;

use crate::error::{Error, Result};
use crate::transport::Region;
use std::os::raw::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Run `f`, turning its error into an `ncclResult_t` and a caught panic into InternalError:
/// a panic must never cross the ABI (it would abort the host process).
pub(crate) fn boundary(what: &'static str, f: impl FnOnce() -> Result<()>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            log::warn!("{what}: {e}");
            e.nccl_code()
        }
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            log::error!("{what}: internal panic caught at the ABI boundary: {msg}");
            Error::Internal(msg).nccl_code()
        }
    }
}

/// A checked, writable out-pointer.
pub(crate) struct Out<T>(*mut T);

impl<T> Out<T> {
    /// # Safety
    /// `p` is NULL or points to writable memory for a `T`, as the ABI promises for out-arguments.
    pub(crate) unsafe fn new(p: *mut T, name: &str) -> Result<Out<T>> {
        if p.is_null() {
            Err(Error::arg(name, "NULL"))
        } else {
            Ok(Out(p))
        }
    }

    pub(crate) fn set(&self, v: T) {
        // SAFETY: non-NULL and writable per the contract of `Out::new`.
        unsafe { self.0.write(v) }
    }
}

/// The opaque handle behind a pointer NCCL gives back to us (never dereferenced).
pub(crate) fn h(p: *mut c_void) -> u64 {
    p as usize as u64
}

/// The pointer NCCL gets for a handle.
pub(crate) fn ptr(h: Option<u64>) -> *mut c_void {
    h.unwrap_or(0) as usize as *mut c_void
}

/// # Safety
/// `data` is NULL or valid for `len` bytes until the operation using the region completes.
pub(crate) unsafe fn region(data: *mut c_void, len: usize, name: &str) -> Result<Region> {
    if data.is_null() {
        if len == 0 {
            return Ok(Region::empty());
        }
        return Err(Error::arg(name, format!("NULL with size {len}")));
    }
    if (data as usize).checked_add(len).is_none() {
        return Err(Error::arg(name, "address + size overflows"));
    }
    // SAFETY: forwarded from this function's contract.
    Ok(unsafe { Region::from_raw(data as *mut u8, len) })
}

/// A size passed as a C int (older ABIs): negative is an error naming the argument.
pub(crate) fn int_size(v: i32, name: &str) -> Result<usize> {
    usize::try_from(v).map_err(|_| Error::arg(name, format!("{v} is negative")))
}
