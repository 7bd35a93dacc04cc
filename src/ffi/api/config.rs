//! Per-communicator options (`fabricoll_config`): read from the caller's struct, as far as its
//! `size` says it reaches, into `config::Overrides` over the environment's configuration.
use super::types::{
    algo, compress, compress_block, fabricoll_comm, fabricoll_status, fabricoll_unique_id, inplace,
};
use super::{comm, config, out};
use crate::config::{Config, Overrides};
use crate::error::{Error, Result};
use crate::ffi::boundary::boundary;
use std::ffi::CStr;
use std::mem::{offset_of, size_of};
use std::os::raw::{c_char, c_int};

/// A communicator's own settings; every field has a "default" value that defers to the
/// environment (`fabricoll_config_init` sets them all so). New fields are only ever appended:
/// `size` says which ones the caller's struct has.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct fabricoll_config {
    /// sizeof(fabricoll_config) as the caller compiled it: set by `fabricoll_config_init`
    /// (the header's macro passes the caller's sizeof to `fabricoll_config_init_size`).
    pub size: usize,
    /// Deadline in milliseconds (1..=86400000) of the communicator's calls and of its
    /// bootstrap; 0: FABRICOLL_TIMEOUT_MS.
    pub timeout_ms: c_int,
    /// The communicator's default algorithm, a `fabricoll_algo`; AUTO (0): FABRICOLL_ALGO,
    /// else the cost model.
    pub algo: c_int,
    /// The libfabric provider of its fabric; NULL: FABRICOLL_PROVIDER.
    pub provider: *const c_char,
    /// The provider between ranks of one host, or "same" (one fabric); NULL:
    /// FABRICOLL_INTRA_PROVIDER.
    pub intra_provider: *const c_char,
    /// The address a unique id's bootstrap root listens on (an IPv4 or IPv6 address of this
    /// host); NULL: FABRICOLL_BOOTSTRAP_ADDR.
    pub bootstrap_addr: *const c_char,
    /// What a failed in-place collective leaves in the caller's buffer, a `fabricoll_inplace`;
    /// DEFAULT (0): FABRICOLL_INPLACE_RESTORE, whose default leaves it undefined (as MPI and
    /// NCCL), sparing every in-place call a copy of its input.
    pub inplace: c_int,
    /// The wire format of the communicator's compressed collectives, a `fabricoll_compress`;
    /// DEFAULT (0): FABRICOLL_COMPRESS (off unless set).
    pub compress: c_int,
    /// Elements per scale of the compressed codes, 1..=1048576; 0: FABRICOLL_COMPRESS_BLOCK
    /// (256 unless set).
    pub compress_block: c_int,
}

/// Field `$f` of the caller's struct at `$p`, or None where its `size` ends before it.
macro_rules! field {
    ($p:expr, $size:expr, $f:ident, $t:ty) => {{
        let off = offset_of!(fabricoll_config, $f);
        if off + size_of::<$t>() <= $size {
            // SAFETY: the caller's struct is readable for `size` bytes (its documented
            // contract), and this field lies within them.
            Some(unsafe { $p.cast::<u8>().add(off).cast::<$t>().read_unaligned() })
        } else {
            None
        }
    }};
}

/// The overrides of the caller's struct (NULL: none, the environment's settings).
///
/// # Safety
/// `p` is NULL or points to a struct readable for its `size` field's bytes.
unsafe fn overrides(p: *const fabricoll_config) -> Result<Overrides> {
    if p.is_null() {
        return Ok(Overrides::default());
    }
    // SAFETY: a non-NULL config starts with its size field (the caller's contract).
    let size = unsafe { p.cast::<usize>().read_unaligned() };
    let full = size_of::<fabricoll_config>();
    if !(size_of::<usize>()..=full).contains(&size) {
        return Err(Error::arg(
            "config.size",
            format!(
                "{size} is not the size of a fabricoll_config (at most {full}, this library's; call fabricoll_config_init first)"
            ),
        ));
    }
    let string = |v: Option<*const c_char>, name: &str| -> Result<Option<String>> {
        match v {
            Some(s) if !s.is_null() => {
                // SAFETY: a non-NULL string field is a NUL-terminated string (the contract).
                let c = unsafe { CStr::from_ptr(s) };
                c.to_str()
                    .map(|s| Some(s.to_string()))
                    .map_err(|_| Error::arg(name, "is not UTF-8"))
            }
            _ => Ok(None),
        }
    };
    let timeout_ms = field!(p, size, timeout_ms, c_int)
        .filter(|&t| t != 0)
        .map(i64::from);
    let algo = match field!(p, size, algo, c_int) {
        None => None,
        Some(v) => algo(v).map_err(|_| {
            Error::arg(
                "config.algo",
                format!("{v} is not a fabricoll_algo (0..=12)"),
            )
        })?,
    };
    let inplace_restore = match field!(p, size, inplace, c_int) {
        None => None,
        Some(v) => inplace(v).ok_or_else(|| {
            Error::arg(
                "config.inplace",
                format!("{v} is not a fabricoll_inplace (0..=2)"),
            )
        })?,
    };
    let compress = match field!(p, size, compress, c_int) {
        None => None,
        Some(v) => compress(v, "config.compress")?,
    };
    let compress_block = match field!(p, size, compress_block, c_int) {
        None => None,
        Some(v) => compress_block(v, "config.compress_block")?,
    };
    Ok(Overrides {
        timeout_ms,
        algo,
        inplace_restore,
        compress,
        compress_block,
        provider: string(field!(p, size, provider, *const c_char), "config.provider")?,
        intra_provider: string(
            field!(p, size, intra_provider, *const c_char),
            "config.intra_provider",
        )?,
        bootstrap_addr: string(
            field!(p, size, bootstrap_addr, *const c_char),
            "config.bootstrap_addr",
        )?,
    })
}

/// The environment's configuration with the caller's settings over it.
///
/// # Safety
/// As `overrides`.
unsafe fn resolve(p: *const fabricoll_config) -> Result<Config> {
    // SAFETY: forwarded from this function's contract.
    let o = unsafe { overrides(p) }?;
    config()?.with_overrides(&o)
}

/// The size of the first `fabricoll_config` (through `bootstrap_addr`): what a caller compiled
/// against that header passes, and the least `fabricoll_config_init_size` accepts.
pub const CONFIG_V1_SIZE: usize = offset_of!(fabricoll_config, inplace);

/// Field `$f` of the caller's struct at `$p` set to `$v` where its `size` reaches it.
macro_rules! put {
    ($p:expr, $size:expr, $f:ident, $t:ty, $v:expr) => {{
        let off = offset_of!(fabricoll_config, $f);
        if off + size_of::<$t>() <= $size {
            let v: $t = $v;
            // SAFETY: the caller's struct is writable for `size` bytes (checked against this
            // library's struct by the caller of this macro), and this field lies within them.
            unsafe { $p.cast::<u8>().add(off).cast::<$t>().write_unaligned(v) };
        }
    }};
}

/// Set every field of the caller's struct, `size` bytes as the caller compiled it, to its
/// default (the environment's settings) and `size` to that size. The header's
/// `fabricoll_config_init(config)` calls this with `sizeof(*(config))`, so a library newer than
/// the caller's header never writes past the caller's struct.
///
/// # Safety
/// `config` is NULL (an error) or writable for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn fabricoll_config_init_size(
    config: *mut fabricoll_config,
    size: usize,
) -> fabricoll_status {
    boundary("fabricoll_config_init_size", || {
        if config.is_null() {
            return Err(Error::arg("config", "is NULL"));
        }
        // SAFETY: forwarded from this function's contract.
        unsafe { init_size(config, size) }
    })
}

/// `fabricoll_config_init_size`'s body.
///
/// # Safety
/// `p` is non-NULL and writable for `size` bytes.
unsafe fn init_size(p: *mut fabricoll_config, size: usize) -> Result<()> {
    let full = size_of::<fabricoll_config>();
    if size < CONFIG_V1_SIZE {
        return Err(Error::arg(
            "size",
            format!("{size} is smaller than any fabricoll_config ({CONFIG_V1_SIZE} bytes or more)"),
        ));
    }
    if size > full {
        return Err(Error::arg(
            "size",
            format!(
                "{size} is larger than this library's fabricoll_config ({full} bytes): the header is newer than the library"
            ),
        ));
    }
    put!(p, size, size, usize, size);
    put!(p, size, timeout_ms, c_int, 0);
    put!(p, size, algo, c_int, 0);
    put!(p, size, provider, *const c_char, std::ptr::null());
    put!(p, size, intra_provider, *const c_char, std::ptr::null());
    put!(p, size, bootstrap_addr, *const c_char, std::ptr::null());
    put!(p, size, inplace, c_int, 0);
    put!(p, size, compress, c_int, 0);
    put!(p, size, compress_block, c_int, 0);
    Ok(())
}

/// The first header's `fabricoll_config_init`, kept for programs built against it: it sets
/// the first struct's fields and `size` to `CONFIG_V1_SIZE`, and writes nothing beyond. The
/// current header maps `fabricoll_config_init` to `fabricoll_config_init_size`.
///
/// # Safety
/// `config` is NULL (an error) or writable for `CONFIG_V1_SIZE` bytes.
#[no_mangle]
pub unsafe extern "C" fn fabricoll_config_init(config: *mut fabricoll_config) -> fabricoll_status {
    boundary("fabricoll_config_init", || {
        if config.is_null() {
            return Err(Error::arg("config", "is NULL"));
        }
        // SAFETY: forwarded from this function's contract.
        unsafe { init_size(config, CONFIG_V1_SIZE) }
    })
}

/// `fabricoll_get_unique_id` with the settings of `config` (NULL: the environment's): its
/// root listens on `config->bootstrap_addr` and serves for `config->timeout_ms`.
///
/// # Safety
/// `config` is NULL or points to a struct readable for `config->size` bytes, whose string
/// fields are NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn fabricoll_get_unique_id_config(
    id: *mut fabricoll_unique_id,
    config: *const fabricoll_config,
) -> fabricoll_status {
    boundary("fabricoll_get_unique_id_config", || {
        let id = out(id, "id")?;
        // SAFETY: the function's contract.
        let cfg = unsafe { resolve(config) }?;
        id.set(comm::unique_id(&cfg)?);
        Ok(())
    })
}

/// `fabricoll_comm_init_rank` with the settings of `config` (NULL: the environment's): the
/// communicator's (and its bootstrap's) timeout, its providers and its default algorithm.
///
/// # Safety
/// As `fabricoll_comm_init_rank`; `config` as for `fabricoll_get_unique_id_config`.
#[no_mangle]
pub unsafe extern "C" fn fabricoll_comm_init_rank_config(
    comm: *mut *mut fabricoll_comm,
    nranks: c_int,
    id: *const fabricoll_unique_id,
    rank: c_int,
    config: *const fabricoll_config,
) -> fabricoll_status {
    boundary("fabricoll_comm_init_rank_config", || {
        // SAFETY: the function's contract.
        let cfg = unsafe { resolve(config) }?;
        // SAFETY: the function's contract.
        unsafe { comm::init_rank(comm, nranks, id, rank, &cfg) }
    })
}
