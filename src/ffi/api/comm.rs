//! The communicator's life: unique id, init, split, rank and size, algorithm, abort, destroy.
use super::handles::{abort_comm, comm_of, destroy_comm, register_comm};
use super::types::{algo, fabricoll_comm, fabricoll_status, fabricoll_unique_id};
use super::{config, out};
use crate::coll::{bootstrap, Comm};
use crate::error::Error;
use crate::ffi::arg_ref;
use crate::ffi::boundary::boundary;
use std::os::raw::{c_char, c_int};

/// Make a unique id: this process starts the bootstrap root that the communicator's ranks meet
/// at (it serves one communicator, then ends). Listens on `FABRICOLL_BOOTSTRAP_ADDR` (default
/// 127.0.0.1).
#[no_mangle]
pub extern "C" fn fabricoll_get_unique_id(id: *mut fabricoll_unique_id) -> fabricoll_status {
    boundary("fabricoll_get_unique_id", || {
        let id = out(id, "id")?;
        let cfg = config()?;
        let u = bootstrap::new_unique_id(bootstrap::default_bind_ip(cfg), cfg.timeout)?;
        let mut internal = [0 as c_char; 128];
        for (d, s) in internal.iter_mut().zip(u.to_bytes()) {
            *d = s as c_char;
        }
        id.set(fabricoll_unique_id { internal });
        Ok(())
    })
}

/// Create this rank's communicator (collective over all `nranks` ranks; blocks until every rank
/// has joined, at most `FABRICOLL_TIMEOUT_MS`).
///
/// # Safety
/// `id` is NULL or points to a readable `fabricoll_unique_id`; `comm` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn fabricoll_comm_init_rank(
    comm: *mut *mut fabricoll_comm,
    nranks: c_int,
    id: *const fabricoll_unique_id,
    rank: c_int,
) -> fabricoll_status {
    boundary("fabricoll_comm_init_rank", || {
        let comm = out(comm, "comm")?;
        comm.set(std::ptr::null_mut());
        // SAFETY: the C API documents `id` as NULL or a readable fabricoll_unique_id.
        let id = unsafe { arg_ref(id, "id") }?;
        let bytes: Vec<u8> = id.internal.iter().map(|c| *c as u8).collect();
        let nr = usize::try_from(nranks)
            .map_err(|_| Error::arg("nranks", format!("{nranks} is negative")))?;
        let r =
            usize::try_from(rank).map_err(|_| Error::arg("rank", format!("{rank} is negative")))?;
        let c = Comm::init_rank(nr, &bootstrap::UniqueId::from_bytes(&bytes)?, r, config()?)?;
        comm.set(register_comm(c));
        Ok(())
    })
}

/// Free a communicator. Collectives still in flight on it are aborted and their requests freed.
#[no_mangle]
pub extern "C" fn fabricoll_comm_destroy(comm: *mut fabricoll_comm) -> fabricoll_status {
    boundary("fabricoll_comm_destroy", || destroy_comm(comm))
}

/// Abort: collectives in flight fail (in-place inputs are restored), later calls fail, and
/// test / wait on any of its requests return FABRICOLL_INVALID_USAGE.
#[no_mangle]
pub extern "C" fn fabricoll_comm_abort(comm: *mut fabricoll_comm) -> fabricoll_status {
    boundary("fabricoll_comm_abort", || abort_comm(comm))
}

/// Split by `color` (negative: this rank joins no new communicator, `*newcomm` is NULL),
/// ranks ordered by `key` then old rank. Collective over `comm`.
#[no_mangle]
pub extern "C" fn fabricoll_comm_split(
    comm: *mut fabricoll_comm,
    color: c_int,
    key: c_int,
    newcomm: *mut *mut fabricoll_comm,
) -> fabricoll_status {
    boundary("fabricoll_comm_split", || {
        let newcomm = out(newcomm, "newcomm")?;
        newcomm.set(std::ptr::null_mut());
        if let Some(c) = comm_of(comm)?.comm.split(color, key, config()?)? {
            newcomm.set(register_comm(c));
        }
        Ok(())
    })
}

/// This rank's index in `comm`.
#[no_mangle]
pub extern "C" fn fabricoll_comm_rank(
    comm: *mut fabricoll_comm,
    rank: *mut c_int,
) -> fabricoll_status {
    boundary("fabricoll_comm_rank", || {
        out(rank, "rank")?.set(comm_of(comm)?.comm.rank as c_int);
        Ok(())
    })
}

/// The number of ranks of `comm`.
#[no_mangle]
pub extern "C" fn fabricoll_comm_size(
    comm: *mut fabricoll_comm,
    size: *mut c_int,
) -> fabricoll_status {
    boundary("fabricoll_comm_size", || {
        out(size, "size")?.set(comm_of(comm)?.comm.nranks as c_int);
        Ok(())
    })
}

/// The communicator's algorithm (a `fabricoll_algo`; AUTO: the cost model). Every rank must set
/// the same.
#[no_mangle]
pub extern "C" fn fabricoll_comm_set_algo(
    comm: *mut fabricoll_comm,
    algo_v: c_int,
) -> fabricoll_status {
    boundary("fabricoll_comm_set_algo", || {
        let a = algo(algo_v)?;
        comm_of(comm)?.comm.set_algo(a);
        Ok(())
    })
}
