//! Per-call options (`fabricoll_call_options`) and `fabricoll_collective_options`: a
//! `fabricoll_call` with them, such as its compression. The call takes `fabricoll_collective`'s
//! path whole (checks, device buffers, groups); the options reach the communicator as this
//! thread's setting for the calls started inside it (`coll::with_call_compression`).
use super::collectives::fabricoll_collective;
use super::types::{
    compress, compress_block, fabricoll_call, fabricoll_comm, fabricoll_request, fabricoll_status,
};
use crate::compress::DEFAULT_BLOCK;
use crate::config::Compression;
use crate::error::{Error, Result};
use crate::ffi::boundary::boundary;
use std::mem::{offset_of, size_of};
use std::os::raw::c_int;

/// Options of one call; every field has a "default" value that defers to the communicator
/// (`fabricoll_call_options_init` sets them all so). New fields are only ever appended: `size`
/// says which ones the caller's struct has.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct fabricoll_call_options {
    /// sizeof(fabricoll_call_options) as the caller compiled it: set by
    /// `fabricoll_call_options_init` (the header's macro).
    pub size: usize,
    /// The call's compression, a `fabricoll_compress`; DEFAULT (0): the communicator's
    /// (fabricoll_config.compress, FABRICOLL_COMPRESS). A format other than OFF on a call it
    /// does not apply to is FABRICOLL_INVALID_ARGUMENT naming `compress`.
    pub compress: c_int,
    /// Elements per scale, 1..=1048576; 0: 256. With `compress` DEFAULT it must be 0 (the
    /// communicator's setting then holds whole).
    pub compress_block: c_int,
}

/// The smallest `fabricoll_call_options` (through `compress_block`).
const OPTIONS_V1_SIZE: usize = size_of::<fabricoll_call_options>();

/// Field `$f` of the caller's options at `$p`, or None where its `size` ends before it.
macro_rules! field {
    ($p:expr, $size:expr, $f:ident) => {{
        let off = offset_of!(fabricoll_call_options, $f);
        if off + size_of::<c_int>() <= $size {
            // SAFETY: the caller's struct is readable for `size` bytes (its documented
            // contract), and this field lies within them.
            Some(unsafe { $p.cast::<u8>().add(off).cast::<c_int>().read_unaligned() })
        } else {
            None
        }
    }};
}

/// The per-call compression of the caller's options (None: the communicator's).
///
/// # Safety
/// `p` is NULL or points to a struct readable for its `size` field's bytes.
unsafe fn compression(p: *const fabricoll_call_options) -> Result<Option<Compression>> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: a non-NULL options struct starts with its size field (the caller's contract).
    let size = unsafe { p.cast::<usize>().read_unaligned() };
    let full = size_of::<fabricoll_call_options>();
    if !(size_of::<usize>()..=full).contains(&size) {
        return Err(Error::arg(
            "options.size",
            format!(
                "{size} is not the size of a fabricoll_call_options (at most {full}, this library's; call fabricoll_call_options_init first)"
            ),
        ));
    }
    let format = match field!(p, size, compress) {
        Some(v) => compress(v, "options.compress")?,
        None => None,
    };
    let block = match field!(p, size, compress_block) {
        Some(v) => compress_block(v, "options.compress_block")?,
        None => None,
    };
    Ok(match (format, block) {
        (None, None) => None,
        (Some(format), b) => Some(Compression {
            format,
            block: b.unwrap_or(DEFAULT_BLOCK),
        }),
        (None, Some(_)) => {
            return Err(Error::arg(
                "options.compress_block",
                "set without options.compress: name the format too",
            ))
        }
    })
}

/// Set every field of the caller's options, `size` bytes as the caller compiled them, to its
/// default (the communicator's settings) and `size` to that size. The header's
/// `fabricoll_call_options_init(options)` calls this with `sizeof(*(options))`.
///
/// # Safety
/// `options` is NULL (an error) or writable for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn fabricoll_call_options_init_size(
    options: *mut fabricoll_call_options,
    size: usize,
) -> fabricoll_status {
    boundary("fabricoll_call_options_init_size", || {
        if options.is_null() {
            return Err(Error::arg("options", "is NULL"));
        }
        let full = size_of::<fabricoll_call_options>();
        if !(OPTIONS_V1_SIZE..=full).contains(&size) {
            return Err(Error::arg(
                "size",
                format!("{size} is not the size of a fabricoll_call_options ({OPTIONS_V1_SIZE}..={full} bytes)"),
            ));
        }
        // SAFETY: the caller's struct is writable for `size` bytes, which is this library's
        // struct (checked above).
        unsafe {
            options.write_unaligned(fabricoll_call_options {
                size,
                compress: 0,
                compress_block: 0,
            })
        };
        Ok(())
    })
}

/// `fabricoll_collective` with per-call options (NULL: none, as `fabricoll_collective`):
/// blocking when `request` is NULL, else non-blocking.
///
/// # Safety
/// As `fabricoll_collective`; `options` is NULL or points to a struct readable for its
/// `size` field's bytes.
#[no_mangle]
pub unsafe extern "C" fn fabricoll_collective_options(
    c: *const fabricoll_call,
    options: *const fabricoll_call_options,
    comm: *mut fabricoll_comm,
    request: *mut *mut fabricoll_request,
) -> fabricoll_status {
    let mut setting = None;
    let read: fabricoll_status = boundary("fabricoll_collective_options", || {
        // SAFETY: the function's contract.
        setting = unsafe { compression(options) }?;
        Ok(())
    });
    if read != fabricoll_status::FABRICOLL_SUCCESS {
        return read;
    }
    match setting {
        // SAFETY: the function's contract is fabricoll_collective's.
        None => unsafe { fabricoll_collective(c, comm, request) },
        Some(s) => crate::coll::with_call_compression(s, || {
            // SAFETY: as above.
            unsafe { fabricoll_collective(c, comm, request) }
        }),
    }
}
