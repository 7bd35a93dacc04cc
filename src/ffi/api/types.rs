//! The C API's types: status codes, the enums passed as `int` (each value an explicit number,
//! mapped by an explicit match, never by the order of a Rust array), the opaque handles and
//! the plain structs.
use crate::algo::{Algorithm, Collective};
use crate::error::{Error, Result};
use crate::reduce::{DataType, RedOp};
use std::os::raw::{c_char, c_int, c_void};

/// Status codes of the C API. The values are stable: new codes are only ever appended.
#[repr(C)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum fabricoll_status {
    FABRICOLL_SUCCESS = 0,
    FABRICOLL_INVALID_ARGUMENT = 1,
    FABRICOLL_INVALID_USAGE = 2,
    FABRICOLL_SYSTEM_ERROR = 3,
    FABRICOLL_INTERNAL_ERROR = 4,
    FABRICOLL_REMOTE_ERROR = 5,
    FABRICOLL_TIMEOUT = 6,
    FABRICOLL_IN_PROGRESS = 7,
}

impl From<&Error> for fabricoll_status {
    fn from(e: &Error) -> Self {
        match e {
            Error::InvalidArgument(_) => fabricoll_status::FABRICOLL_INVALID_ARGUMENT,
            Error::InvalidUsage(_) => fabricoll_status::FABRICOLL_INVALID_USAGE,
            Error::System(_) => fabricoll_status::FABRICOLL_SYSTEM_ERROR,
            Error::Internal(_) => fabricoll_status::FABRICOLL_INTERNAL_ERROR,
            Error::Remote(_) => fabricoll_status::FABRICOLL_REMOTE_ERROR,
            Error::Timeout(_) => fabricoll_status::FABRICOLL_TIMEOUT,
        }
    }
}

/// Data types (NCCL's values). Passed as `int`.
#[repr(C)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms, dead_code)]
pub enum fabricoll_datatype {
    FABRICOLL_INT8 = 0,
    FABRICOLL_UINT8 = 1,
    FABRICOLL_INT32 = 2,
    FABRICOLL_UINT32 = 3,
    FABRICOLL_INT64 = 4,
    FABRICOLL_UINT64 = 5,
    FABRICOLL_FLOAT16 = 6,
    FABRICOLL_FLOAT32 = 7,
    FABRICOLL_FLOAT64 = 8,
    FABRICOLL_BFLOAT16 = 9,
    FABRICOLL_FP8_E4M3 = 10,
    FABRICOLL_FP8_E5M2 = 11,
}

/// Reduction operations (NCCL's values 0..=4, then the bitwise ops). Passed as `int`.
/// `BAND`, `BOR` and `BXOR` combine the bits of integer types; with a floating-point datatype
/// they are an invalid argument.
#[repr(C)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms, dead_code)]
pub enum fabricoll_redop {
    FABRICOLL_SUM = 0,
    FABRICOLL_PROD = 1,
    FABRICOLL_MAX = 2,
    FABRICOLL_MIN = 3,
    FABRICOLL_AVG = 4,
    FABRICOLL_BAND = 5,
    FABRICOLL_BOR = 6,
    FABRICOLL_BXOR = 7,
}

/// Algorithms (`FABRICOLL_ALGO` names). Passed as `int`; AUTO lets the cost model choose.
#[repr(C)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms, dead_code)]
pub enum fabricoll_algo {
    FABRICOLL_ALGO_AUTO = 0,
    FABRICOLL_ALGO_RING = 1,
    FABRICOLL_ALGO_BIDIR_RING = 2,
    FABRICOLL_ALGO_MESH = 3,
    FABRICOLL_ALGO_MESH1 = 4,
    FABRICOLL_ALGO_RDH = 5,
    FABRICOLL_ALGO_RD = 6,
    FABRICOLL_ALGO_TREE = 7,
    FABRICOLL_ALGO_DBTREE = 8,
    FABRICOLL_ALGO_BRUCK = 9,
    FABRICOLL_ALGO_PAIRWISE = 10,
    FABRICOLL_ALGO_HIER = 11,
    FABRICOLL_ALGO_SWIZZLE = 12,
}

/// What a failed in-place collective leaves in the caller's buffer (`fabricoll_config`'s
/// `inplace`). Passed as `int`. Restoring costs a copy of the input on every in-place call
/// whose steps write over it; MPI and NCCL leave the buffer undefined, and so does the default.
#[repr(C)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms, dead_code)]
pub enum fabricoll_inplace {
    /// FABRICOLL_INPLACE_RESTORE decides (unset or 0: undefined, 1: restored).
    FABRICOLL_INPLACE_DEFAULT = 0,
    /// The input as it was before the call: each call first copies it aside.
    FABRICOLL_INPLACE_RESTORE = 1,
    /// Undefined (the error says so): the call works in the buffer itself.
    FABRICOLL_INPLACE_UNDEFINED = 2,
}

/// A `fabricoll_inplace` value: whether a failed in-place call restores its input, `None`
/// for DEFAULT.
pub(super) fn inplace(v: c_int) -> Option<Option<bool>> {
    use fabricoll_inplace as I;
    const DEFAULT: c_int = I::FABRICOLL_INPLACE_DEFAULT as c_int;
    const RESTORE: c_int = I::FABRICOLL_INPLACE_RESTORE as c_int;
    const UNDEFINED: c_int = I::FABRICOLL_INPLACE_UNDEFINED as c_int;
    match v {
        DEFAULT => Some(None),
        RESTORE => Some(Some(true)),
        UNDEFINED => Some(Some(false)),
        _ => None,
    }
}

/// The wire format of compressed collectives (`fabricoll_config.compress`,
/// `fabricoll_call_options.compress`; docs/compression.md). Passed as `int`. AllReduce (sum,
/// avg), ReduceScatter(V) and AllGather(V) of float, bfloat16 and half data send block-scaled
/// codes of the format; every rank of a call must ask for the same.
#[repr(C)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms, dead_code)]
pub enum fabricoll_compress {
    /// Defer: a communicator to FABRICOLL_COMPRESS, a call to its communicator.
    FABRICOLL_COMPRESS_DEFAULT = 0,
    /// Send the data as it is.
    FABRICOLL_COMPRESS_OFF = 1,
    FABRICOLL_COMPRESS_BF16 = 2,
    FABRICOLL_COMPRESS_FP16 = 3,
    FABRICOLL_COMPRESS_FP8E4M3 = 4,
    FABRICOLL_COMPRESS_FP8E5M2 = 5,
    FABRICOLL_COMPRESS_INT8 = 6,
    FABRICOLL_COMPRESS_INT4 = 7,
}

/// A `fabricoll_compress` value: the format, `None` for DEFAULT; an error naming `name`.
pub(super) fn compress(v: c_int, name: &str) -> Result<Option<crate::compress::Format>> {
    use crate::compress::Format;
    use fabricoll_compress as C;
    const DEFAULT: c_int = C::FABRICOLL_COMPRESS_DEFAULT as c_int;
    const OFF: c_int = C::FABRICOLL_COMPRESS_OFF as c_int;
    const BF16: c_int = C::FABRICOLL_COMPRESS_BF16 as c_int;
    const FP16: c_int = C::FABRICOLL_COMPRESS_FP16 as c_int;
    const E4M3: c_int = C::FABRICOLL_COMPRESS_FP8E4M3 as c_int;
    const E5M2: c_int = C::FABRICOLL_COMPRESS_FP8E5M2 as c_int;
    const INT8: c_int = C::FABRICOLL_COMPRESS_INT8 as c_int;
    const INT4: c_int = C::FABRICOLL_COMPRESS_INT4 as c_int;
    Ok(Some(match v {
        DEFAULT => return Ok(None),
        OFF => Format::Off,
        BF16 => Format::Bf16,
        FP16 => Format::Fp16,
        E4M3 => Format::Fp8E4m3,
        E5M2 => Format::Fp8E5m2,
        INT8 => Format::Int8,
        INT4 => Format::Int4,
        _ => {
            return Err(Error::arg(
                name,
                format!("{v} is not a fabricoll_compress (0..=7)"),
            ))
        }
    }))
}

/// A block size field (elements per scale): `None` for 0 (the default); an error naming `name`.
pub(super) fn compress_block(v: c_int, name: &str) -> Result<Option<usize>> {
    match v {
        0 => Ok(None),
        b => crate::config::Compression::block(name, &b.to_string()).map(Some),
    }
}

/// Collectives, for `fabricoll_call`. Passed as `int`.
#[repr(C)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms, dead_code)]
pub enum fabricoll_coll {
    FABRICOLL_COLL_ALLREDUCE = 0,
    FABRICOLL_COLL_ALLGATHER = 1,
    FABRICOLL_COLL_REDUCESCATTER = 2,
    FABRICOLL_COLL_BROADCAST = 3,
    FABRICOLL_COLL_REDUCE = 4,
    FABRICOLL_COLL_ALLTOALL = 5,
}

/// An opaque communicator.
#[allow(non_camel_case_types)]
pub struct fabricoll_comm {
    _private: [u8; 0],
}

/// An opaque request of a non-blocking call.
#[allow(non_camel_case_types)]
pub struct fabricoll_request {
    _private: [u8; 0],
}

/// The bootstrap handle of a communicator: made by `fabricoll_get_unique_id` on one process,
/// copied to every rank (by any means), passed to `fabricoll_comm_init_rank`.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct fabricoll_unique_id {
    pub internal: [c_char; 128],
}

/// One call of any collective, for `fabricoll_collective` (the per-call algorithm override).
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct fabricoll_call {
    /// A `fabricoll_coll` value.
    pub coll: c_int,
    /// Input (ignored on non-root ranks of a broadcast; may be NULL there).
    pub sendbuf: *const c_void,
    /// Output (ignored on non-root ranks of a reduce; may be NULL there).
    pub recvbuf: *mut c_void,
    /// Elements, as in NCCL: per rank for allgather (sent), reducescatter (received) and
    /// alltoall (per peer); the whole buffer otherwise.
    pub count: usize,
    /// A `fabricoll_datatype` value.
    pub datatype: c_int,
    /// A `fabricoll_redop` value (ignored when the collective does not reduce).
    pub op: c_int,
    /// Root rank of broadcast and reduce.
    pub root: c_int,
    /// A `fabricoll_algo` value; AUTO (0) defers to the communicator.
    pub algo: c_int,
}

pub(super) fn dtype(v: c_int) -> Result<DataType> {
    DataType::from_nccl(v).ok_or_else(|| {
        Error::arg(
            "datatype",
            format!(
                "{v} is not a fabricoll_datatype (0..={})",
                DataType::ALL.len() - 1
            ),
        )
    })
}

pub(super) fn redop(v: c_int) -> Result<RedOp> {
    RedOp::from_c(v)
        .ok_or_else(|| Error::arg("op", format!("{v} is not a fabricoll_redop (0..=7)")))
}

/// A `fabricoll_algo` value: `None` for AUTO.
pub(super) fn algo(v: c_int) -> Result<Option<Algorithm>> {
    use fabricoll_algo as A;
    const AUTO: c_int = A::FABRICOLL_ALGO_AUTO as c_int;
    const RING: c_int = A::FABRICOLL_ALGO_RING as c_int;
    const BIDIR_RING: c_int = A::FABRICOLL_ALGO_BIDIR_RING as c_int;
    const MESH: c_int = A::FABRICOLL_ALGO_MESH as c_int;
    const MESH1: c_int = A::FABRICOLL_ALGO_MESH1 as c_int;
    const RDH: c_int = A::FABRICOLL_ALGO_RDH as c_int;
    const RD: c_int = A::FABRICOLL_ALGO_RD as c_int;
    const TREE: c_int = A::FABRICOLL_ALGO_TREE as c_int;
    const DBTREE: c_int = A::FABRICOLL_ALGO_DBTREE as c_int;
    const BRUCK: c_int = A::FABRICOLL_ALGO_BRUCK as c_int;
    const PAIRWISE: c_int = A::FABRICOLL_ALGO_PAIRWISE as c_int;
    const HIER: c_int = A::FABRICOLL_ALGO_HIER as c_int;
    const SWIZZLE: c_int = A::FABRICOLL_ALGO_SWIZZLE as c_int;
    Ok(Some(match v {
        AUTO => return Ok(None),
        RING => Algorithm::Ring,
        BIDIR_RING => Algorithm::BidirRing,
        MESH => Algorithm::Mesh,
        MESH1 => Algorithm::Mesh1,
        RDH => Algorithm::Rdh,
        RD => Algorithm::Rd,
        TREE => Algorithm::Tree,
        DBTREE => Algorithm::DbTree,
        BRUCK => Algorithm::Bruck,
        PAIRWISE => Algorithm::Pairwise,
        HIER => Algorithm::Hier,
        SWIZZLE => Algorithm::Swizzle,
        _ => {
            return Err(Error::arg(
                "algo",
                format!("{v} is not a fabricoll_algo (0..=12)"),
            ))
        }
    }))
}

/// A `fabricoll_coll` value.
pub(super) fn coll(v: c_int) -> Result<Collective> {
    use fabricoll_coll as C;
    const ALLREDUCE: c_int = C::FABRICOLL_COLL_ALLREDUCE as c_int;
    const ALLGATHER: c_int = C::FABRICOLL_COLL_ALLGATHER as c_int;
    const REDUCESCATTER: c_int = C::FABRICOLL_COLL_REDUCESCATTER as c_int;
    const BROADCAST: c_int = C::FABRICOLL_COLL_BROADCAST as c_int;
    const REDUCE: c_int = C::FABRICOLL_COLL_REDUCE as c_int;
    const ALLTOALL: c_int = C::FABRICOLL_COLL_ALLTOALL as c_int;
    Ok(match v {
        ALLREDUCE => Collective::AllReduce,
        ALLGATHER => Collective::AllGather,
        REDUCESCATTER => Collective::ReduceScatter,
        BROADCAST => Collective::Broadcast,
        REDUCE => Collective::Reduce,
        ALLTOALL => Collective::AllToAll,
        _ => {
            return Err(Error::arg(
                "coll",
                format!("{v} is not a fabricoll_coll (0..=5)"),
            ))
        }
    })
}
