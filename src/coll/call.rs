//! One call as the communicator receives it (`Call`, `Kind`, `Layout`), and the checks of its
//! arguments that need no communicator state: root and peer ranks, tags, the op for the type,
//! the per-rank counts of the varied collectives, and the byte size of every buffer.
use crate::algo::varied::{self, Block, Spec, Varied};
use crate::algo::{AlgoError, Algorithm, Collective, Problem};
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
    /// One side of a tagged transfer (tag at most `exec::MAX_TAG`; tag 0 matches the
    /// untagged `Send` and `Recv`).
    Tagged {
        send: bool,
        peer: usize,
        tag: u32,
    },
    /// A collective of `algo::varied`: `count` and `root` are Gather's and Scatter's, the
    /// layout holds the per-rank counts of the others.
    Varied(Layout),
}

/// The per-rank counts and displacements of a varied collective, in the caller's memory as
/// `usize` values (`nranks` of them per region), read when the call starts: they need to
/// stay valid only until `Comm::start` or `Comm::run` returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub coll: Varied,
    /// AllGatherV and ReduceScatterV: recvcounts; AllToAllV: sendcounts.
    pub counts: Region,
    /// AllGatherV: displs; AllToAllV: sdispls; empty: the blocks are packed in rank order.
    pub displs: Region,
    /// AllToAllV: recvcounts and rdispls (empty: packed).
    pub recv_counts: Region,
    pub recv_displs: Region,
}

impl Layout {
    /// A layout without counts (Gather, Scatter, Barrier); set the regions the collective uses.
    pub fn new(coll: Varied) -> Layout {
        Layout {
            coll,
            counts: Region::empty(),
            displs: Region::empty(),
            recv_counts: Region::empty(),
            recv_displs: Region::empty(),
        }
    }

    /// Rank `rank`'s spec of this collective with `count` and `root` (Gather, Scatter), or an
    /// error naming the argument that is wrong.
    pub fn spec(&self, count: usize, root: usize, nranks: usize, rank: usize) -> Result<Spec> {
        let words = |r: Region, name: &str| -> Result<Option<Vec<usize>>> {
            if r.is_empty() {
                return Ok(None);
            }
            let w = std::mem::size_of::<usize>();
            if r.len() != nranks * w {
                return Err(Error::arg(
                    name,
                    format!("{} bytes, not {nranks} counts", r.len()),
                ));
            }
            Ok(Some(r.with(|b| {
                b.chunks_exact(w)
                    .map(|c| usize::from_ne_bytes(c.try_into().expect("chunks of a word")))
                    .collect()
            })))
        };
        let need = |r: Region, name: &str| {
            words(r, name)?.ok_or_else(|| Error::arg(name, "NULL: the collective needs it"))
        };
        let blocks = |counts: Vec<usize>, displs: Option<Vec<usize>>| -> Vec<Block> {
            match displs {
                Some(d) => d.into_iter().zip(counts).collect(),
                None => {
                    let mut off = 0usize;
                    counts
                        .into_iter()
                        .map(|c| {
                            let b = (off, c);
                            off = off.saturating_add(c);
                            b
                        })
                        .collect()
                }
            }
        };
        let spec = match self.coll {
            Varied::Gather => Spec::Gather { count, root },
            Varied::Scatter => Spec::Scatter { count, root },
            Varied::Barrier => Spec::Barrier,
            Varied::AllGatherV => {
                let counts = need(self.counts, "recvcounts")?;
                if counts[rank] != count {
                    return Err(Error::arg(
                        "sendcount",
                        format!(
                            "{count}, but recvcounts[{rank}] (this rank's) is {}",
                            counts[rank]
                        ),
                    ));
                }
                Spec::AllGatherV {
                    blocks: blocks(counts, words(self.displs, "displs")?),
                }
            }
            Varied::ReduceScatterV => Spec::ReduceScatterV {
                counts: need(self.counts, "recvcounts")?,
            },
            Varied::AllToAllV => Spec::AllToAllV {
                send: blocks(
                    need(self.counts, "sendcounts")?,
                    words(self.displs, "sdispls")?,
                ),
                recv: blocks(
                    need(self.recv_counts, "recvcounts")?,
                    words(self.recv_displs, "rdispls")?,
                ),
            },
        };
        varied::validate(&spec, nranks, rank).map_err(algo_arg)?;
        Ok(spec)
    }
}

/// An `AlgoError::Invalid` ("name: why") as an error naming the argument.
pub(super) fn algo_arg(e: AlgoError) -> Error {
    match e {
        AlgoError::Invalid(s) => match s.split_once(": ") {
            Some((name, why)) => Error::arg(name, why),
            None => Error::InvalidArgument(s),
        },
        e => Error::InvalidArgument(e.to_string()),
    }
}

/// Bytes of rank `rank`'s input and output buffers of `spec`, if they fit the address space.
pub fn varied_bytes(
    spec: &Spec,
    dtype: DataType,
    nranks: usize,
    rank: usize,
) -> Result<(usize, usize)> {
    let (i, o) = spec.lens(rank, nranks);
    Ok((buffer_bytes(i, dtype, 1)?, buffer_bytes(o, dtype, 1)?))
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

    /// Rank `rank`'s spec of a varied collective on `nranks` ranks, its arguments checked.
    pub(super) fn varied_spec(&self, l: &Layout, nranks: usize, rank: usize) -> Result<Spec> {
        if l.coll == Varied::ReduceScatterV && !self.op.supports(self.dtype) {
            return Err(Error::arg(
                "op",
                format!(
                    "{} is a bitwise op, for integer types only, not {}",
                    self.op, self.dtype
                ),
            ));
        }
        let spec = l.spec(self.count, self.root, nranks, rank)?;
        varied_bytes(&spec, self.dtype, nranks, rank)?;
        Ok(spec)
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
