//! The communicator's life: unique id, init, split, rank and size, algorithm, abort, destroy.
use super::handles::{abort_comm, comm_of, destroy_comm, register_comm, register_comm_with};
use super::types::{algo, fabricoll_comm, fabricoll_status, fabricoll_unique_id};
use super::{config, out};
use crate::coll::{bootstrap, launch, Comm};
use crate::config::Config;
use crate::error::{Error, Result};
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
        id.set(unique_id(config()?)?);
        Ok(())
    })
}

/// A new unique id, its root listening where `cfg` says.
pub(super) fn unique_id(cfg: &Config) -> Result<fabricoll_unique_id> {
    let u = bootstrap::new_unique_id(bootstrap::default_bind_ip(cfg), cfg.timeout_setting())?;
    let mut internal = [0 as c_char; 128];
    for (d, s) in internal.iter_mut().zip(u.to_bytes()) {
        *d = s as c_char;
    }
    Ok(fabricoll_unique_id { internal })
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
        // SAFETY: the function's contract.
        unsafe { init_rank(comm, nranks, id, rank, config()?) }
    })
}

/// `fabricoll_comm_init_rank` under `cfg`.
///
/// # Safety
/// As `fabricoll_comm_init_rank`.
pub(super) unsafe fn init_rank(
    comm: *mut *mut fabricoll_comm,
    nranks: c_int,
    id: *const fabricoll_unique_id,
    rank: c_int,
    cfg: &Config,
) -> Result<()> {
    let comm = out(comm, "comm")?;
    comm.set(std::ptr::null_mut());
    // SAFETY: the C API documents `id` as NULL or a readable fabricoll_unique_id.
    let id = unsafe { arg_ref(id, "id") }?;
    let bytes: Vec<u8> = id.internal.iter().map(|c| *c as u8).collect();
    let nr = usize::try_from(nranks)
        .map_err(|_| Error::arg("nranks", format!("{nranks} is negative")))?;
    let r = usize::try_from(rank).map_err(|_| Error::arg("rank", format!("{rank} is negative")))?;
    let c = Comm::init_rank(nr, &bootstrap::UniqueId::from_bytes(&bytes, "id")?, r, cfg)?;
    let own = (cfg != config()?).then(|| cfg.clone());
    comm.set(register_comm_with(c, own));
    Ok(())
}

/// Create this rank's communicator from the environment its launcher set: rank, rank count
/// and how the ranks meet (collective over all ranks; blocks until every rank has joined, at
/// most `FABRICOLL_TIMEOUT_MS`). Fails, naming the variable, where no launcher variable is set
/// or they are inconsistent.
///
/// Launchers, first found wins: fabricoll's own (`FABRICOLL_RANK`, `FABRICOLL_NRANKS`),
/// torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`), Open MPI (`OMPI_COMM_WORLD_RANK`, `_SIZE`,
/// `_LOCAL_RANK`), MPICH Hydra (`PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`), Slurm
/// (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`). How the ranks meet, first set wins:
/// `FABRICOLL_UNIQUE_ID` (hex, from `fabricoll-info --unique-id`), `FABRICOLL_ROOT`
/// (host:port; rank 0 listens there), `FABRICOLL_ROOT_FILE` (a path every rank sees; rank 0
/// writes its id there), torchrun's `MASTER_ADDR` at port `MASTER_PORT + 1`.
///
/// Recipes (`./app` calls this function; 2 hosts `node1`, `node2`, 4 ranks each):
///
/// ```sh
/// # torchrun, on node N (0, 1); the root listens on MASTER_PORT + 1:
/// torchrun --nnodes 2 --nproc-per-node 4 --node-rank N --master-addr node1 --no-python ./app
/// # Open MPI:
/// mpirun -np 8 -H node1:4,node2:4 -x FABRICOLL_ROOT=node1:29400 ./app
/// # Slurm (the job id keeps two jobs apart):
/// srun -N 2 --ntasks-per-node 4 --export ALL,FABRICOLL_ROOT_FILE=$HOME/.fabricoll-$SLURM_JOB_ID ./app
/// # MPICH Hydra:
/// mpiexec -n 8 -hosts node1:4,node2:4 -genv FABRICOLL_ROOT node1:29400 ./app
/// # Any launcher, with a unique id served by a tool on node1 until all 8 ranks have joined:
/// ID=$(fabricoll-info --unique-id --ranks 8 --bind node1-address &)
/// mpirun -np 8 -H node1:4,node2:4 -x FABRICOLL_UNIQUE_ID=$ID ./app
/// ```
#[no_mangle]
pub extern "C" fn fabricoll_comm_init_env(comm: *mut *mut fabricoll_comm) -> fabricoll_status {
    boundary("fabricoll_comm_init_env", || {
        let comm = out(comm, "comm")?;
        comm.set(std::ptr::null_mut());
        comm.set(register_comm(launch::init_from_env(config()?)?));
        Ok(())
    })
}

/// Free a communicator. Collectives still in flight on it are aborted and their requests freed.
/// Returns without waiting for the other ranks; what this rank sent still reaches them: its
/// endpoint stays open in the background until each rank it talked to has destroyed its own
/// communicator too, aborted it, or is gone (at most the communicator's timeout), and process
/// exit waits for that. After `fabricoll_comm_abort`, the endpoint closes at once.
#[no_mangle]
pub extern "C" fn fabricoll_comm_destroy(comm: *mut fabricoll_comm) -> fabricoll_status {
    boundary("fabricoll_comm_destroy", || destroy_comm(comm))
}

/// Abort: collectives in flight fail (in-place inputs are restored where the communicator
/// restores them, `fabricoll_config.inplace`, else undefined), later calls fail, and
/// test / wait on any of its requests return FABRICOLL_INVALID_USAGE. The ranks it talked to
/// are told (best effort), so that their destroy and exit do not wait for it. Its destroy
/// closes the endpoint at once: messages of this rank that a peer had not yet taken may be
/// lost.
#[no_mangle]
pub extern "C" fn fabricoll_comm_abort(comm: *mut fabricoll_comm) -> fabricoll_status {
    boundary("fabricoll_comm_abort", || abort_comm(comm))
}

/// Split by `color` (negative: this rank joins no new communicator, `*newcomm` is NULL),
/// ranks ordered by `key` then old rank. Collective over `comm`. The new communicator has
/// `comm`'s settings (those of its `fabricoll_config`, if it was made with one).
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
        let parent = comm_of(comm)?;
        let cfg = match &parent.cfg {
            Some(c) => c,
            None => config()?,
        };
        if let Some(c) = parent.comm.split(color, key, cfg)? {
            newcomm.set(register_comm_with(c, parent.cfg.clone()));
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

/// A communicator made in Rust (on any transport: the loopback one in tests) as a C API
/// handle, which `fabricoll_comm_destroy` frees: a test tool, reachable from Rust only (as
/// `coll::device::install` is).
pub fn comm_handle(c: Comm) -> *mut fabricoll_comm {
    register_comm(c)
}

/// How many device calls of `comm` took the direct path (docs/device-calls.md): a test tool,
/// reachable from Rust only.
pub fn device_direct_calls(comm: *mut fabricoll_comm) -> Result<u64> {
    Ok(comm_of(comm)?.streams.direct_calls())
}
