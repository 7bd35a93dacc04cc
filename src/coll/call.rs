//! One call as the communicator receives it (`Call`, `Kind`), and the checks of its arguments
//! that need no communicator state: root and peer ranks, the op for the type, and the byte size
//! of every buffer.
use crate::algo::{Algorithm, Collective, Problem};
use crate::error::{Error, Result};
use crate::reduce::{DataType, RedOp};
use crate::transport::Region;

/// What to run: a collective, or one side of a point-to-point transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Coll(Collective),
    /// AllGather or ReduceScatter over elements `[offset, offset+len)` of the global
    /// `nranks x count` vector (NCCL CollNet's windows; see `algo::Problem::window`).
    Window {
        coll: Collective,
        offset: usize,
        len: usize,
    },
    Send {
        peer: usize,
    },
    Recv {
        peer: usize,
    },
}

/// One call. `count` follows NCCL (see `algo::Problem`).
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub kind: Kind,
    pub send: Region,
    pub recv: Region,
    pub count: usize,
    pub dtype: DataType,
    pub op: RedOp,
    pub root: usize,
    /// Per-call algorithm (None: the communicator's choice).
    pub algo: Option<Algorithm>,
}

/// A request of a non-blocking call.
pub type RequestId = u64;

/// The largest buffer a call may name: no allocation, and no pointer offset, spans more.
const MAX_BYTES: usize = isize::MAX as usize;

impl Call {
    /// The problem of a collective call on `nranks` ranks, once its root and the byte size of
    /// its buffers are known to be possible. Nothing is allocated before this check passes.
    #[inline]
    pub(super) fn problem(&self, coll: Collective, nranks: usize) -> Result<Problem> {
        if matches!(coll, Collective::Broadcast | Collective::Reduce) && self.root >= nranks {
            return Err(Error::arg(
                "root",
                format!("{} is not a rank of {nranks}", self.root),
            ));
        }
        if coll.reduces() && !self.op.supports(self.dtype) {
            return Err(Error::arg(
                "op",
                format!(
                    "{} is a bitwise op, for integer types only, not {}",
                    self.op, self.dtype
                ),
            ));
        }
        // AllGather receives, ReduceScatter sends, AllToAll sends and receives `nranks`
        // chunks of `count` elements (windows name elements of that same global vector).
        let chunks = match (coll, self.kind) {
            (_, Kind::Window { .. }) => nranks,
            (Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll, _) => nranks,
            _ => 1,
        };
        buffer_bytes(self.count, self.dtype, chunks)?;
        let mut p = Problem::new(coll, nranks, self.count).with_root(self.root);
        if let Kind::Window { offset, len, .. } = self.kind {
            p.window = Some((offset, len));
        }
        Ok(p)
    }

    /// Check the peer and the buffer of a point-to-point call on `nranks` ranks.
    #[inline]
    pub(super) fn check_p2p(&self, peer: usize, nranks: usize) -> Result<()> {
        if peer >= nranks {
            return Err(Error::arg(
                "peer",
                format!("{peer} is not a rank of {nranks}"),
            ));
        }
        buffer_bytes(self.count, self.dtype, 1).map(|_| ())
    }
}

/// Bytes of a buffer of `chunks` times `count` elements of `dtype`, if it fits the address
/// space; otherwise an error naming `count`.
#[inline]
fn buffer_bytes(count: usize, dtype: DataType, chunks: usize) -> Result<usize> {
    let elem = dtype.size();
    count
        .checked_mul(elem)
        .and_then(|b| b.checked_mul(chunks))
        .filter(|&b| b <= MAX_BYTES)
        .ok_or_else(|| {
            let times = if chunks > 1 {
                format!(" x {chunks} ranks")
            } else {
                String::new()
            };
            Error::arg(
                "count",
                format!(
                    "{count} elements of {elem} bytes{times}: the buffer's bytes exceed the \
                     address space (isize::MAX = {MAX_BYTES})"
                ),
            )
        })
}
