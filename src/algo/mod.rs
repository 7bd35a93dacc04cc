//! Collective algorithms as data. PURE: no I/O, no unsafe.
//!
//! A `Schedule` is, for each rank, an ordered list of typed steps over three buffers (`In`, the
//! caller's input; `Out`, the caller's output; `Tmp`, scratch). Each step names the earlier
//! steps of the same rank it depends on; a step may run once they have completed, so the
//! executor overlaps whatever the dependencies allow (slices of a ring pipeline naturally).
//! Messages match in program order per ordered pair: the k-th `Send` from rank a to rank b is
//! received by the k-th `Recv`/`RecvReduce` from a on rank b.
//!
//! Schedules never write `In` and never alias `In` with `Out`: the executor runs an in-place
//! call on a backup of the input, or in the caller's buffer where `exec::inplace` shows which
//! reads need a copy or a dependency. Lengths and offsets are in elements; the executor scales
//! by the type size.
#![forbid(unsafe_code)]

pub mod bidir_ring;
pub mod bruck;
mod build;
mod builder;
pub mod check;
pub mod dbtree;
pub mod hier;
pub mod hosts;
pub mod lanes;
pub mod mesh;
pub mod mesh1;
pub mod pairwise;
pub mod rd;
pub mod rdh;
pub mod ring;
pub mod swizzle;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_layouts;
#[cfg(test)]
mod tests_scale;
#[cfg(test)]
mod tests_varied;
pub mod tree;
pub mod varied;

use std::fmt;

pub use build::{build, implementation, supports, Collectives};
pub use builder::{chunks, no_deps, slices, Builder, Deps, MAX_SLICES};
pub use hosts::Hosts;

/// The collectives of NCCL and MPI that the engines implement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    AllToAll,
}

impl Collective {
    pub const ALL: [Collective; 6] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllToAll,
    ];

    /// The names of the collectives, as the C API, `FABRICOLL_ALGO` and the tools' `--coll`
    /// take them.
    pub const NAMES: [(&'static str, Collective); 8] = [
        ("allreduce", Collective::AllReduce),
        ("allgather", Collective::AllGather),
        ("reducescatter", Collective::ReduceScatter),
        ("reduce_scatter", Collective::ReduceScatter),
        ("broadcast", Collective::Broadcast),
        ("bcast", Collective::Broadcast),
        ("reduce", Collective::Reduce),
        ("alltoall", Collective::AllToAll),
    ];

    /// The collective `s` names (one of `NAMES`).
    pub fn from_name(s: &str) -> Option<Collective> {
        Collective::NAMES
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, c)| *c)
    }

    /// Does the collective combine values (so a reduction op applies)?
    pub fn reduces(self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::ReduceScatter | Collective::Reduce
        )
    }
}

/// The problem a schedule solves. `count` follows NCCL: AllReduce, Broadcast, Reduce: elements
/// in the buffer; AllGather: elements each rank contributes; ReduceScatter: elements each rank
/// receives; AllToAll: elements sent to each peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Problem {
    pub coll: Collective,
    pub nranks: usize,
    pub count: usize,
    /// Root rank (Broadcast, Reduce); 0 otherwise.
    pub root: usize,
    /// AllGather / ReduceScatter restricted to elements `[offset, offset+len)` of the global
    /// `nranks x count` vector (NCCL CollNet's windows): each rank contributes (AllGather) or
    /// receives (ReduceScatter) only the part of its own slice inside the window.
    pub window: Option<(usize, usize)>,
    /// The collective of `varied` this problem is (then `coll` is the uniform one nearest in
    /// kind), with a hash of the counts every rank must agree on; None for uniform ones.
    pub shape: Option<varied::Shape>,
}

impl Problem {
    pub fn new(coll: Collective, nranks: usize, count: usize) -> Problem {
        Problem {
            coll,
            nranks,
            count,
            root: 0,
            window: None,
            shape: None,
        }
    }

    /// A windowed AllGather or ReduceScatter (see `window`).
    pub fn with_window(mut self, offset: usize, len: usize) -> Problem {
        self.window = Some((offset, len));
        self
    }

    /// Rank k's slice of the (windowed) global vector: (offset in the window, length).
    pub fn slice(&self, k: usize) -> (usize, usize) {
        match self.window {
            None => (k * self.count, self.count),
            Some((off, len)) => {
                let lo = (k * self.count).clamp(off, off + len);
                let hi = ((k + 1) * self.count).clamp(off, off + len);
                (lo - off, hi - lo)
            }
        }
    }

    /// Where rank k's windowed slice starts inside its own slice (0 without a window).
    pub fn slice_start(&self, k: usize) -> usize {
        match self.window {
            None => 0,
            Some((off, len)) => {
                let lo = (k * self.count).clamp(off, off + len);
                lo.saturating_sub(k * self.count).min(self.count)
            }
        }
    }

    pub fn with_root(mut self, root: usize) -> Problem {
        self.root = root;
        self
    }

    /// Elements of each rank's input buffer (rank-independent upper bound for windows: use
    /// `in_len_of`).
    pub fn in_len(&self) -> usize {
        if let (Some((_, len)), Collective::ReduceScatter) = (self.window, self.coll) {
            return len;
        }
        match self.coll {
            Collective::ReduceScatter | Collective::AllToAll => self.count * self.nranks,
            _ => self.count,
        }
    }

    /// Elements of rank k's input buffer.
    pub fn in_len_of(&self, k: usize) -> usize {
        match (self.window, self.coll) {
            (Some(_), Collective::AllGather) => self.slice(k).1,
            _ => self.in_len(),
        }
    }

    /// Elements of rank k's output buffer.
    pub fn out_len_of(&self, k: usize) -> usize {
        match (self.window, self.coll) {
            (Some(_), Collective::ReduceScatter) => self.slice(k).1,
            _ => self.out_len(),
        }
    }

    /// Elements of each rank's output buffer.
    pub fn out_len(&self) -> usize {
        if let (Some((_, len)), Collective::AllGather) = (self.window, self.coll) {
            return len;
        }
        match self.coll {
            Collective::AllGather | Collective::AllToAll => self.count * self.nranks,
            _ => self.count,
        }
    }
}

/// Which buffer a span lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Buf {
    In,
    Out,
    Tmp,
}

/// A range of elements of one buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Span {
    pub buf: Buf,
    pub off: usize,
    pub len: usize,
}

impl Span {
    pub fn new(buf: Buf, off: usize, len: usize) -> Span {
        Span { buf, off, len }
    }

    /// The sub-range `[off, off+len)` of this span (relative offsets).
    pub fn sub(&self, off: usize, len: usize) -> Span {
        debug_assert!(off + len <= self.len, "sub-span out of range");
        Span {
            buf: self.buf,
            off: self.off + off,
            len,
        }
    }

    pub fn end(&self) -> usize {
        self.off + self.len
    }

    pub fn overlaps(&self, o: &Span) -> bool {
        self.buf == o.buf && self.len > 0 && o.len > 0 && self.off < o.end() && o.off < self.end()
    }
}

/// One step of one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Send `src` to `peer`.
    Send { peer: usize, src: Span },
    /// Receive from `peer` into `dst`.
    Recv { peer: usize, dst: Span },
    /// Receive from `peer` and store `src ⊕ message` in `dst` (`src` may equal `dst`).
    RecvReduce { peer: usize, src: Span, dst: Span },
    /// `dst = src`.
    Copy { src: Span, dst: Span },
    /// `dst = a ⊕ b` (`dst` may equal `a` or `b`).
    Reduce { a: Span, b: Span, dst: Span },
    /// Does nothing; joins dependencies.
    Nop,
}

impl Op {
    /// Spans this op reads.
    pub fn reads(&self) -> Vec<Span> {
        self.read_spans().into_iter().flatten().collect()
    }

    /// The spans this op reads, without an allocation.
    pub fn read_spans(&self) -> [Option<Span>; 2] {
        match self {
            Op::Send { src, .. } | Op::Copy { src, .. } | Op::RecvReduce { src, .. } => {
                [Some(*src), None]
            }
            Op::Reduce { a, b, .. } => [Some(*a), Some(*b)],
            Op::Recv { .. } | Op::Nop => [None, None],
        }
    }

    /// The span this op writes.
    pub fn writes(&self) -> Option<Span> {
        match self {
            Op::Recv { dst, .. }
            | Op::RecvReduce { dst, .. }
            | Op::Copy { dst, .. }
            | Op::Reduce { dst, .. } => Some(*dst),
            Op::Send { .. } | Op::Nop => None,
        }
    }

    /// The peer of a communication op.
    pub fn peer(&self) -> Option<usize> {
        match self {
            Op::Send { peer, .. } | Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => {
                Some(*peer)
            }
            _ => None,
        }
    }

    pub fn is_recv(&self) -> bool {
        matches!(self, Op::Recv { .. } | Op::RecvReduce { .. })
    }
}

/// An op and the earlier steps (indices into the same rank's list) it waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub op: Op,
    pub deps: Vec<usize>,
}

/// The algorithms. `Hier` composes an intra-host and an inter-host algorithm; `Swizzle` is the
/// node-swizzled two-level ReduceScatter and its mirror AllGather.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Algorithm {
    Ring,
    BidirRing,
    Mesh,
    Mesh1,
    Rdh,
    Rd,
    Tree,
    DbTree,
    Bruck,
    Pairwise,
    Hier,
    Swizzle,
}

impl Algorithm {
    pub const ALL: [Algorithm; 12] = [
        Algorithm::Ring,
        Algorithm::BidirRing,
        Algorithm::Mesh,
        Algorithm::Mesh1,
        Algorithm::Rdh,
        Algorithm::Rd,
        Algorithm::Tree,
        Algorithm::DbTree,
        Algorithm::Bruck,
        Algorithm::Pairwise,
        Algorithm::Hier,
        Algorithm::Swizzle,
    ];

    /// The name used by `FABRICOLL_ALGO` and the C API.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::BidirRing => "bidir_ring",
            Algorithm::Mesh => "mesh",
            Algorithm::Mesh1 => "mesh1",
            Algorithm::Rdh => "rdh",
            Algorithm::Rd => "rd",
            Algorithm::Tree => "tree",
            Algorithm::DbTree => "dbtree",
            Algorithm::Bruck => "bruck",
            Algorithm::Pairwise => "pairwise",
            Algorithm::Hier => "hier",
            Algorithm::Swizzle => "swizzle",
        }
    }

    pub fn from_name(s: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == s)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Tuning knobs of a schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Options {
    /// Largest message in elements (messages are sliced to pipeline); 0 = no slicing.
    pub slice: usize,
    /// Which host each rank is on (`Hier`, `Swizzle`, and the rank order of flat algorithms).
    pub hosts: Hosts,
    /// Intra-host and inter-host algorithms of `Hier` (`Swizzle` uses `intra`).
    pub intra: Algorithm,
    pub inter: Algorithm,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            slice: 0,
            hosts: Hosts::ONE,
            intra: Algorithm::Ring,
            inter: Algorithm::Ring,
        }
    }
}

/// Why a schedule could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AlgoError {
    /// The algorithm does not implement this collective.
    NotApplicable { algo: Algorithm, coll: Collective },
    /// The problem or the options are invalid; the text names the field.
    Invalid(String),
}

impl fmt::Display for AlgoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AlgoError::NotApplicable { algo, coll } => {
                write!(f, "algorithm {algo} does not implement {coll:?}")
            }
            AlgoError::Invalid(s) => f.write_str(s),
        }
    }
}

pub type AlgoResult<T> = Result<T, AlgoError>;

/// A complete schedule: every rank's steps and scratch needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub problem: Problem,
    pub algo: Algorithm,
    /// Elements of scratch each rank needs.
    pub tmp_len: Vec<usize>,
    pub ranks: Vec<Vec<Step>>,
}
