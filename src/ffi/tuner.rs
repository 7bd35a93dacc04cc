//! The tuner plugin's ABI: `ncclTunerPlugin_v2` ... `ncclTunerPlugin_v6`, exported from the
//! net plugin's library, where NCCL looks for a tuner when no other is set (docs/nccl-abi.md,
//! "The tuner"). v6 is native; v2 to v5 are shims over the same functions. Each entry point
//! checks its pointers and makes one call into `plugin::tuner`, inside the panic boundary.
//! `getCollInfo` and `getChunkSize` always return ncclSuccess (NCCL fails the collective on an
//! error): what they cannot use they log and leave alone. The Neuron flavour compiles the
//! tables without exporting them.
#![allow(non_upper_case_globals)]
use super::net::{Logger, Res, VoidP, VoidPP};
use super::{boundary, h, non_null, ptr, Out};
use crate::error::Result;
use crate::ffi::logging;
use crate::plugin::tuner::{self, Chunking, CostTable, Tuner, CONSTANTS_LEN};
use std::mem::{offset_of, size_of};
use std::os::raw::{c_char, c_int};

/// `ncclNvlDomainInfo_v5_t` (v6 uses the same).
#[repr(C)]
pub struct NvlDomainInfoV5 {
    pub n_nvl_domains: c_int,
    pub min_ranks_per_nvl_domain: c_int,
    pub max_ranks_per_nvl_domain: c_int,
}

/// `ncclTunerConstants_v5_t` (v6 uses the same): algorithms 7, protocols 3, link kinds 3,
/// compute capabilities 4, node scales 3.
#[repr(C)]
pub struct ConstantsV5 {
    pub base_latencies: [[f64; 3]; 7],
    pub hw_latencies: [[[f64; 3]; 7]; 3],
    pub ll_max_bws: [[f64; 3]; 4],
    pub per_ch_max_ring_ll128_bws: [[f64; 3]; 4],
    pub per_ch_max_tree_ll128_bws: [[f64; 3]; 4],
    pub per_ch_max_tree_bws: [[f64; 3]; 4],
    pub per_ch_max_nvls_tree_bws: [[f64; 3]; 4],
}

type FInitV2 = unsafe extern "C" fn(usize, usize, Logger, VoidPP) -> Res;
type FInitV5 = unsafe extern "C" fn(
    VoidPP,
    u64,
    usize,
    usize,
    Logger,
    *mut NvlDomainInfoV5,
    *mut ConstantsV5,
) -> Res;
type FCollInfoV2 = unsafe extern "C" fn(
    VoidP,
    c_int,
    usize,
    c_int,
    c_int,
    c_int,
    *mut c_int,
    *mut c_int,
    *mut c_int,
) -> Res;
type FCollInfoV3 = unsafe extern "C" fn(
    VoidP,
    c_int,
    usize,
    c_int,
    *mut *mut f32,
    c_int,
    c_int,
    *mut c_int,
) -> Res;
type FCollInfoV4 = unsafe extern "C" fn(
    VoidP,
    c_int,
    usize,
    c_int,
    *mut *mut f32,
    c_int,
    c_int,
    c_int,
    *mut c_int,
) -> Res;
type FChunkSize = unsafe extern "C" fn(VoidP, c_int, usize, c_int, c_int, c_int, *mut usize) -> Res;
type FClose = unsafe extern "C" fn(VoidP) -> Res;

/// `ncclTuner_v2_t`. The tables are immutable statics: a static name and fn pointers.
#[repr(C)]
pub struct TunerV2 {
    pub name: *const c_char,
    pub init: FInitV2,
    pub get_coll_info: FCollInfoV2,
    pub destroy: FClose,
}

/// `ncclTuner_v3_t`: the cost table arrives.
#[repr(C)]
pub struct TunerV3 {
    pub name: *const c_char,
    pub init: FInitV2,
    pub get_coll_info: FCollInfoV3,
    pub destroy: FClose,
}

/// `ncclTuner_v4_t`: `regBuff` before `nChannels`.
#[repr(C)]
pub struct TunerV4 {
    pub name: *const c_char,
    pub init: FInitV2,
    pub get_coll_info: FCollInfoV4,
    pub destroy: FClose,
}

/// `ncclTuner_v5_t`: per-communicator `init` with NCCL's constants; `finalize`.
#[repr(C)]
pub struct TunerV5 {
    pub name: *const c_char,
    pub init: FInitV5,
    pub get_coll_info: FCollInfoV4,
    pub finalize: FClose,
}

/// `ncclTuner_v6_t`: v5 plus the optional `getChunkSize`.
#[repr(C)]
pub struct TunerV6 {
    pub name: *const c_char,
    pub init: FInitV5,
    pub get_coll_info: FCollInfoV4,
    pub finalize: FClose,
    pub get_chunk_size: Option<FChunkSize>,
}

// SAFETY: immutable static data (each of the five tables): a static string and fn pointers.
unsafe impl Sync for TunerV2 {}
// SAFETY: as above.
unsafe impl Sync for TunerV3 {}
// SAFETY: as above.
unsafe impl Sync for TunerV4 {}
// SAFETY: as above.
unsafe impl Sync for TunerV5 {}
// SAFETY: as above.
unsafe impl Sync for TunerV6 {}

const _: () = {
    assert!(size_of::<NvlDomainInfoV5>() == 12);
    assert!(size_of::<ConstantsV5>() == CONSTANTS_LEN * 8 && CONSTANTS_LEN == 144);
    assert!(offset_of!(ConstantsV5, hw_latencies) == 168);
    assert!(offset_of!(ConstantsV5, ll_max_bws) == 672);
    assert!(offset_of!(ConstantsV5, per_ch_max_ring_ll128_bws) == 768);
    assert!(offset_of!(ConstantsV5, per_ch_max_tree_ll128_bws) == 864);
    assert!(offset_of!(ConstantsV5, per_ch_max_tree_bws) == 960);
    assert!(offset_of!(ConstantsV5, per_ch_max_nvls_tree_bws) == 1056);
    assert!(size_of::<TunerV2>() == 32 && offset_of!(TunerV2, destroy) == 24);
    assert!(size_of::<TunerV3>() == 32 && size_of::<TunerV4>() == 32);
    assert!(size_of::<TunerV5>() == 32 && offset_of!(TunerV5, finalize) == 24);
    assert!(size_of::<TunerV6>() == 40 && offset_of!(TunerV6, get_chunk_size) == 32);
};

/// The tuner's name in NCCL's log.
pub const NAME: &std::ffi::CStr = c"fabricoll";

#[cfg_attr(not(feature = "neuron"), no_mangle)]
pub static ncclTunerPlugin_v6: TunerV6 = TunerV6 {
    name: NAME.as_ptr(),
    init: init_v5::<true>,
    get_coll_info: get_coll_info_v4,
    finalize: close,
    get_chunk_size: Some(get_chunk_size),
};

#[cfg_attr(not(feature = "neuron"), no_mangle)]
pub static ncclTunerPlugin_v5: TunerV5 = TunerV5 {
    name: NAME.as_ptr(),
    init: init_v5::<false>,
    get_coll_info: get_coll_info_v4,
    finalize: close,
};

#[cfg_attr(not(feature = "neuron"), no_mangle)]
pub static ncclTunerPlugin_v4: TunerV4 = TunerV4 {
    name: NAME.as_ptr(),
    init: init_v2,
    get_coll_info: get_coll_info_v4,
    destroy: close,
};

#[cfg_attr(not(feature = "neuron"), no_mangle)]
pub static ncclTunerPlugin_v3: TunerV3 = TunerV3 {
    name: NAME.as_ptr(),
    init: init_v2,
    get_coll_info: get_coll_info_v3,
    destroy: close,
};

#[cfg_attr(not(feature = "neuron"), no_mangle)]
pub static ncclTunerPlugin_v2: TunerV2 = TunerV2 {
    name: NAME.as_ptr(),
    init: init_v2,
    get_coll_info: get_coll_info_v2,
    destroy: close,
};

/// A new context for a communicator of `nranks` ranks on `nnodes` nodes.
fn open(
    ctx: &Out<VoidP>,
    nranks: usize,
    nnodes: usize,
    logger: Logger,
    chunking: Chunking,
    constants: Option<[f64; CONSTANTS_LEN]>,
) -> Result<()> {
    logging::init(logger);
    let cfg = crate::config::get()?;
    let m = tuner::collnet_model(cfg);
    let staging = tuner::collnet_staging();
    let how = if cfg.tuner {
        format!(
            "pricing CollNet and NCCL's ring over this plugin with the engines' cost model (alpha {:.2} us, beta {:.3} GB/s, gamma {:.2} GB/s, eager limit {}), {}",
            m.alpha_us,
            1.0 / (m.beta_us_per_byte * 1e3),
            1.0 / (m.gamma_us_per_byte * 1e3),
            match m.eager_bytes {
                usize::MAX => "none".to_string(),
                b => format!("{b} B"),
            },
            if staging == tuner::Staging::NONE {
                "CollNet on device buffers (no staging)".to_string()
            } else {
                format!(
                    "CollNet staged through host memory ({:.0} us + {:.0} GB/s per copy, two per call)",
                    staging.copy_us,
                    1.0 / (staging.copy_us_per_byte * 1e3)
                )
            }
        )
    } else {
        "off (FABRICOLL_TUNER=0): NCCL keeps its own choices".to_string()
    };
    let mut t = Tuner::new(nranks, nnodes, m, cfg.tuner, chunking)
        .with_forced(cfg.algo)
        .with_staging(staging);
    if let Some(c) = constants {
        t = t.with_constants(c);
    }
    log::info!("tuner: {nranks} ranks on {nnodes} nodes, {how}");
    ctx.set(ptr(Some(tuner::open(t))));
    Ok(())
}

/// v5 and v6 `init` (`OURS`: v6, whose `getChunkSize` lets us pick CollNet's chunks; v5 has
/// none, so NCCL's own are priced). `nvlDomainInfo` and `constants` may be NULL; the
/// constants, when given, are recorded.
unsafe extern "C" fn init_v5<const OURS: bool>(
    ctx: VoidPP,
    _comm_id: u64,
    nranks: usize,
    nnodes: usize,
    logger: Logger,
    _nvl: *mut NvlDomainInfoV5,
    constants: *mut ConstantsV5,
) -> Res {
    boundary("tuner init", || {
        // SAFETY: NCCL passes a writable context pointer, or NULL (rejected by Out::new).
        let ctx = unsafe { Out::new(ctx, "context")? };
        // SAFETY: NULL or NCCL's constants struct, readable during the call; a plain array of
        // doubles of this layout (checked above).
        let c = unsafe { constants.cast::<[f64; CONSTANTS_LEN]>().as_ref() }.copied();
        let chunking = if OURS { Chunking::Ours } else { Chunking::Nccl };
        open(&ctx, nranks, nnodes, logger, chunking, c)
    })
}

/// v2 to v4 `init`: no constants, NCCL's chunks.
unsafe extern "C" fn init_v2(nranks: usize, nnodes: usize, logger: Logger, ctx: VoidPP) -> Res {
    boundary("tuner init", || {
        // SAFETY: as in init_v5.
        let ctx = unsafe { Out::new(ctx, "context")? };
        open(&ctx, nranks, nnodes, logger, Chunking::Nccl, None)
    })
}

/// v4 to v6 `getCollInfo`: `collCostTable` is really `float[numAlgo][numProto]`. Always
/// ncclSuccess; `nChannels` stays as NCCL set it (0: its default). `numPipeOps` and `regBuff`
/// do not change our price: the engines run each CollNet call on its own, registered or not.
unsafe extern "C" fn get_coll_info_v4(
    ctx: VoidP,
    func: c_int,
    nbytes: usize,
    _num_pipe_ops: c_int,
    table: *mut *mut f32,
    nalgo: c_int,
    nproto: c_int,
    _reg_buff: c_int,
    _nchannels: *mut c_int,
) -> Res {
    let r: Res = boundary("tuner getCollInfo", || {
        let t = tuner::context(h(ctx))?;
        let cells = non_null(table, "collCostTable")?.cast::<f32>();
        let (na, np) = (
            super::int_size(nalgo, "numAlgo")?,
            super::int_size(nproto, "numProto")?,
        );
        let n = na
            .checked_mul(np)
            .filter(|n| *n <= 1 << 16)
            .ok_or_else(|| {
                crate::Error::arg(
                    "numAlgo",
                    format!("{nalgo} x {nproto} cells is not a cost table"),
                )
            })?;
        // SAFETY: NCCL's cost table is a contiguous float[numAlgo][numProto] (docs/nccl-abi.md,
        // "The tuner"), non-NULL, writable and not aliased during the call.
        let cells = unsafe { std::slice::from_raw_parts_mut(cells, n) };
        t.get_coll_info(func, nbytes, &mut CostTable::new(cells, na, np)?);
        Ok(())
    });
    success_anyway(r)
}

/// v3 `getCollInfo`: v4's without `regBuff`.
unsafe extern "C" fn get_coll_info_v3(
    ctx: VoidP,
    func: c_int,
    nbytes: usize,
    num_pipe_ops: c_int,
    table: *mut *mut f32,
    nalgo: c_int,
    nproto: c_int,
    nchannels: *mut c_int,
) -> Res {
    // SAFETY: the same arguments NCCL gave us, under the same contract.
    unsafe {
        get_coll_info_v4(
            ctx,
            func,
            nbytes,
            num_pipe_ops,
            table,
            nalgo,
            nproto,
            0,
            nchannels,
        )
    }
}

/// v2 `getCollInfo`: NCCL passes no estimates of its own, only outputs (-1: its choice), so
/// there is nothing to compare our price with: every output is left as NCCL set it.
unsafe extern "C" fn get_coll_info_v2(
    ctx: VoidP,
    _func: c_int,
    _nbytes: usize,
    _collnet: c_int,
    _nvls: c_int,
    _num_pipe_ops: c_int,
    _algorithm: *mut c_int,
    _protocol: *mut c_int,
    _nchannels: *mut c_int,
) -> Res {
    let r: Res = boundary("tuner getCollInfo", || tuner::context(h(ctx)).map(|_| ()));
    success_anyway(r)
}

/// v6 `getChunkSize`: our chunk for CollNet (SIMPLE) on CollNet's collectives; `chunkSize`
/// untouched otherwise. Always ncclSuccess.
unsafe extern "C" fn get_chunk_size(
    ctx: VoidP,
    func: c_int,
    nbytes: usize,
    algo: c_int,
    proto: c_int,
    _nchannels: c_int,
    chunk: *mut usize,
) -> Res {
    let r: Res = boundary("tuner getChunkSize", || {
        let t = tuner::context(h(ctx))?;
        // SAFETY: NCCL passes its chunk size, readable and writable, or NULL (rejected).
        let out = unsafe { Out::new(chunk, "chunkSize")? };
        if let Some(c) = t.get_chunk_size(func, nbytes, algo, proto) {
            out.set(c);
        }
        Ok(())
    });
    success_anyway(r)
}

/// `finalize` (v5, v6) and `destroy` (v2 to v4).
unsafe extern "C" fn close(ctx: VoidP) -> Res {
    boundary("tuner finalize", || tuner::close(h(ctx)))
}

/// What `getCollInfo` and `getChunkSize` return: always ncclSuccess, since NCCL fails the
/// collective on anything else; the boundary has logged the error.
fn success_anyway(_logged: Res) -> Res {
    0
}
