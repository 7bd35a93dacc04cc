//! The C ABI: NCCL's versioned tables (`net`, `collnet`) and the `fabricoll_*` API (`api`).
//! Each export runs inside the one panic boundary (`boundary`), checks its pointers with the
//! helpers below (`non_null` and what builds on it: `Out`, `arg_ref`; `region`), and makes one
//! call into safe Rust. No logic here.
//!
//! The Neuron flavour (feature `neuron`, `libnccom-net.so`) exports the Neuron tables (`neuron`)
//! alone: the NCCL tables stay compiled but unexported, and the C API is left out.
#[cfg(not(feature = "neuron"))]
pub mod api;
pub(crate) mod boundary;
pub mod collnet;
pub mod logging;
pub mod net;
pub mod neuron;
pub mod signals;
pub mod tuner;
pub mod types;

pub(crate) use boundary::boundary;

use crate::error::{Error, Result};
use crate::transport::Region;
use std::os::raw::c_void;

/// The one null check: `p`, or an error naming the argument when it is NULL.
pub(crate) fn non_null<P: Pointer>(p: P, name: &str) -> Result<P> {
    if p.is_null_ptr() {
        Err(Error::arg(name, "NULL"))
    } else {
        Ok(p)
    }
}

/// Raw pointers, for [`non_null`].
pub(crate) trait Pointer: Copy {
    fn is_null_ptr(self) -> bool;
}

impl<T> Pointer for *const T {
    fn is_null_ptr(self) -> bool {
        self.is_null()
    }
}

impl<T> Pointer for *mut T {
    fn is_null_ptr(self) -> bool {
        self.is_null()
    }
}

/// A checked, writable out-pointer.
pub(crate) struct Out<T>(*mut T);

impl<T> Out<T> {
    /// # Safety
    /// `p` is NULL or points to writable memory for a `T`, as the ABI promises for out-arguments.
    pub(crate) unsafe fn new(p: *mut T, name: &str) -> Result<Out<T>> {
        non_null(p, name).map(Out)
    }

    /// An optional out-pointer: `None` when the caller passed NULL.
    ///
    /// # Safety
    /// As for [`Out::new`].
    pub(crate) unsafe fn optional(p: *mut T) -> Option<Out<T>> {
        (!p.is_null()).then_some(Out(p))
    }

    pub(crate) fn set(&self, v: T) {
        // SAFETY: non-NULL and writable per the contract of `Out::new`.
        unsafe { self.0.write(v) }
    }
}

/// The readable argument behind `p`, or an error naming it when `p` is NULL: the one null
/// check for pointers the callee reads (the C API's; the Neuron flavour has none).
///
/// # Safety
/// `p` is NULL or points to a readable `T` that lives for `'a`, as the ABI promises.
#[cfg_attr(feature = "neuron", allow(dead_code))]
pub(crate) unsafe fn arg_ref<'a, T>(p: *const T, name: &str) -> Result<&'a T> {
    // SAFETY: non-NULL, and readable for 'a per this function's contract.
    Ok(unsafe { &*non_null(p, name)? })
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
