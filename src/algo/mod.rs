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

/// Most slices `build` cuts one buffer into. Every slice is a step of the schedule, so a count
/// beyond this names more memory than any machine has; the schedule is refused instead of
/// listed (listing it alone would exhaust memory).
pub const MAX_SLICES: usize = 1 << 24;

/// Split `len` elements into `n` contiguous chunks, the first `len % n` one element longer:
/// uneven chunks, never padding. Returns (offset, length) pairs.
pub fn chunks(len: usize, n: usize) -> Vec<(usize, usize)> {
    let n = n.max(1);
    let (q, r) = (len / n, len % n);
    let mut off = 0;
    (0..n)
        .map(|i| {
            let l = q + usize::from(i < r);
            let c = (off, l);
            off += l;
            c
        })
        .collect()
}

/// Split a span into slices of at most `slice` elements (one slice when `slice` is 0). An
/// empty span gives one empty slice, so that a message still flows (keeping matching simple).
pub fn slices(s: Span, slice: usize) -> Vec<Span> {
    if slice == 0 || s.len <= slice {
        return vec![s];
    }
    let n = s.len.div_ceil(slice);
    chunks(s.len, n)
        .into_iter()
        .map(|(o, l)| s.sub(o, l))
        .collect()
}

/// Appends steps to every rank's list. Algorithms are written against it, over a *group* of
/// ranks (a list of global ranks), so that they compose (Hierarchical runs them on sub-groups).
#[derive(Clone, Debug)]
pub struct Builder {
    pub ranks: Vec<Vec<Step>>,
    pub tmp_len: Vec<usize>,
}

/// For each global rank, the steps a phase must wait for (its "frontier").
pub type Deps = Vec<Vec<usize>>;

impl Builder {
    pub fn new(nranks: usize) -> Builder {
        Builder {
            ranks: vec![Vec::new(); nranks],
            tmp_len: vec![0; nranks],
        }
    }

    pub fn nranks(&self) -> usize {
        self.ranks.len()
    }

    /// Append `op` to `rank`'s list, after `deps`; returns its index.
    pub fn push(&mut self, rank: usize, op: Op, deps: &[usize]) -> usize {
        let v = &mut self.ranks[rank];
        let mut d: Vec<usize> = deps.to_vec();
        d.sort_unstable();
        d.dedup();
        v.push(Step { op, deps: d });
        v.len() - 1
    }

    pub fn send(&mut self, rank: usize, peer: usize, src: Span, deps: &[usize]) -> usize {
        self.push(rank, Op::Send { peer, src }, deps)
    }

    pub fn recv(&mut self, rank: usize, peer: usize, dst: Span, deps: &[usize]) -> usize {
        self.push(rank, Op::Recv { peer, dst }, deps)
    }

    pub fn recv_reduce(
        &mut self,
        rank: usize,
        peer: usize,
        src: Span,
        dst: Span,
        deps: &[usize],
    ) -> usize {
        self.push(rank, Op::RecvReduce { peer, src, dst }, deps)
    }

    /// `dst = src`; nothing is emitted when they are the same span (returns None).
    pub fn copy(&mut self, rank: usize, src: Span, dst: Span, deps: &[usize]) -> Option<usize> {
        if src == dst || src.len == 0 {
            return None;
        }
        Some(self.push(rank, Op::Copy { src, dst }, deps))
    }

    pub fn reduce(&mut self, rank: usize, a: Span, b: Span, dst: Span, deps: &[usize]) -> usize {
        self.push(rank, Op::Reduce { a, b, dst }, deps)
    }

    /// One step that waits for `deps` (to keep dependency lists short).
    pub fn join(&mut self, rank: usize, deps: &[usize]) -> Vec<usize> {
        match deps.len() {
            0 => vec![],
            1 => deps.to_vec(),
            _ => vec![self.push(rank, Op::Nop, deps)],
        }
    }

    /// Scratch of `len` elements on `rank`, after what it already uses.
    pub fn tmp(&mut self, rank: usize, len: usize) -> Span {
        let off = self.tmp_len[rank];
        self.tmp_len[rank] += len;
        Span::new(Buf::Tmp, off, len)
    }

    /// Every step of `rank` so far, joined: the frontier for a phase that must follow them all.
    pub fn frontier(&mut self, rank: usize) -> Vec<usize> {
        let n = self.ranks[rank].len();
        if n == 0 {
            return vec![];
        }
        // Steps that no later step depends on cover everything before them.
        let mut needed = vec![true; n];
        for s in &self.ranks[rank] {
            for d in &s.deps {
                needed[*d] = false;
            }
        }
        let tips: Vec<usize> = (0..n).filter(|i| needed[*i]).collect();
        self.join(rank, &tips)
    }

    /// Frontiers of all ranks.
    pub fn frontiers(&mut self) -> Deps {
        (0..self.nranks()).map(|r| self.frontier(r)).collect()
    }

    pub fn finish(self, problem: Problem, algo: Algorithm) -> Schedule {
        Schedule {
            problem,
            algo,
            tmp_len: self.tmp_len,
            ranks: self.ranks,
        }
    }
}

/// No dependencies for any rank.
pub fn no_deps(nranks: usize) -> Deps {
    vec![Vec::new(); nranks]
}

/// Build the schedule of `algo` for `problem`.
pub fn build(problem: Problem, algo: Algorithm, opts: &Options) -> AlgoResult<Schedule> {
    let n = problem.nranks;
    if n == 0 {
        return Err(AlgoError::Invalid("nranks: must be at least 1".into()));
    }
    if problem.root >= n {
        return Err(AlgoError::Invalid(format!(
            "root: {} is not a rank of {n}",
            problem.root
        )));
    }
    if problem.count.checked_mul(n).is_none() {
        return Err(AlgoError::Invalid("count: count x nranks overflows".into()));
    }
    if let Some((off, len)) = problem.window {
        if !matches!(
            problem.coll,
            Collective::AllGather | Collective::ReduceScatter
        ) {
            return Err(AlgoError::Invalid(
                "window: only AllGather and ReduceScatter take a window".into(),
            ));
        }
        if off.checked_add(len).is_none_or(|e| e > problem.count * n) {
            return Err(AlgoError::Invalid(format!(
                "window: [{off}, +{len}) is outside the {} elements",
                problem.count * n
            )));
        }
        if matches!(algo, Algorithm::Hier | Algorithm::Swizzle) {
            return Err(AlgoError::NotApplicable {
                algo,
                coll: problem.coll,
            });
        }
    }
    let longest = problem.in_len().max(problem.out_len());
    if opts.slice > 0 && longest / opts.slice > MAX_SLICES {
        return Err(AlgoError::Invalid(format!(
            "count: {longest} elements in slices of {} make more than {MAX_SLICES} slices, more \
             steps than a schedule can list",
            opts.slice
        )));
    }
    if !opts.hosts.fits(n) {
        return Err(AlgoError::Invalid(format!(
            "hosts: the layout names {} ranks, the problem has {n}",
            opts.hosts.ranks()
        )));
    }
    let mut b = Builder::new(n);
    // Flat algorithms run in the topology-aware order (each host's ranks contiguous, so that a
    // ring crosses each host boundary once per direction); member m is rank `group[m]` and its
    // chunk and root are that rank's. Two-level algorithms read the layout themselves, and
    // AllToAll's blocks are indexed by member, so they keep the rank order.
    let two_level = matches!(algo, Algorithm::Hier | Algorithm::Swizzle);
    let group: Vec<usize> = if two_level || problem.coll == Collective::AllToAll {
        (0..n).collect()
    } else {
        opts.hosts.order(n)
    };
    let root = group
        .iter()
        .position(|&r| r == problem.root)
        .expect("the root is a rank of the group");
    let start = no_deps(n);
    let inp = |len: usize| vec![Span::new(Buf::In, 0, len); n];
    let out = |len: usize| vec![Span::new(Buf::Out, 0, len); n];
    let c = problem.count;
    let na = || AlgoError::NotApplicable {
        algo,
        coll: problem.coll,
    };
    let algo_impl = implementation(algo).ok_or_else(na)?;
    match problem.coll {
        Collective::AllReduce => {
            algo_impl.all_reduce(&mut b, &group, &inp(c), &out(c), &start, opts)
        }
        Collective::AllGather => {
            let cs: Vec<(usize, usize)> = group.iter().map(|&r| problem.slice(r)).collect();
            let src: Vec<Span> = (0..n).map(|i| Span::new(Buf::In, 0, cs[i].1)).collect();
            algo_impl.all_gather(
                &mut b,
                &group,
                &src,
                &out(problem.out_len()),
                &cs,
                &start,
                opts,
            )
        }
        Collective::ReduceScatter => {
            let cs: Vec<(usize, usize)> = group.iter().map(|&r| problem.slice(r)).collect();
            let dst: Vec<Span> = (0..n).map(|i| Span::new(Buf::Out, 0, cs[i].1)).collect();
            algo_impl.reduce_scatter(
                &mut b,
                &group,
                &inp(problem.in_len()),
                &dst,
                &cs,
                &start,
                opts,
            )
        }
        Collective::Broadcast => {
            algo_impl.broadcast(&mut b, &group, root, &inp(c), &out(c), &start, opts)
        }
        Collective::Reduce => {
            algo_impl.reduce(&mut b, &group, root, &inp(c), &out(c), &start, opts)
        }
        Collective::AllToAll => {
            algo_impl.all_to_all(&mut b, &group, &inp(c * n), &out(c * n), c, &start, opts)
        }
    }
    .map_err(|e| match e {
        AlgoError::NotApplicable { .. } => na(),
        e => e,
    })?;
    if matches!(problem.coll, Collective::Broadcast | Collective::Reduce) && n > 1 {
        confirm_calls(&mut b, n);
    }
    Ok(b.finish(problem, algo))
}

/// Rooted collectives leave some ranks only sending (the Broadcast root, the leaves of a
/// Reduce), and a rank that receives nothing cannot see that another rank's call differs (the
/// executor compares the call signature each message carries). So every rank of a rooted
/// collective also sends an empty message to the next rank and receives one from the previous,
/// none waiting for anything else.
fn confirm_calls(b: &mut Builder, n: usize) {
    for r in 0..n {
        b.send(r, (r + 1) % n, Span::new(Buf::In, 0, 0), &[]);
        b.recv(r, (r + n - 1) % n, Span::new(Buf::Out, 0, 0), &[]);
    }
}

/// What each algorithm implements, over a group of ranks. `src[m]`/`dst[m]` are group member
/// m's spans; `start[g]` are the steps of global rank g the phase waits for. Default methods
/// answer "not applicable".
pub trait Collectives {
    fn algorithm(&self) -> Algorithm;

    fn na(&self, coll: Collective) -> AlgoError {
        AlgoError::NotApplicable {
            algo: self.algorithm(),
            coll,
        }
    }

    /// A sub-algorithm's result, its "not applicable" reported as this algorithm's (for the
    /// compositions of algorithms).
    fn as_own(&self, coll: Collective, r: AlgoResult<()>) -> AlgoResult<()> {
        r.map_err(|e| match e {
            AlgoError::NotApplicable { .. } => self.na(coll),
            e => e,
        })
    }

    /// Every member ends with the reduction of all members' `src` in its `dst` (equal lengths).
    fn all_reduce(
        &self,
        _b: &mut Builder,
        _g: &[usize],
        _src: &[Span],
        _dst: &[Span],
        _start: &Deps,
        _o: &Options,
    ) -> AlgoResult<()> {
        Err(self.na(Collective::AllReduce))
    }

    /// `src[m]` is member m's chunk (length `chunks[m].1`); every member ends with all chunks
    /// in `dst` at `chunks[i].0`.
    #[allow(clippy::too_many_arguments)]
    fn all_gather(
        &self,
        _b: &mut Builder,
        _g: &[usize],
        _src: &[Span],
        _dst: &[Span],
        _chunks: &[(usize, usize)],
        _start: &Deps,
        _o: &Options,
    ) -> AlgoResult<()> {
        Err(self.na(Collective::AllGather))
    }

    /// `src[m]` is member m's whole vector; member m ends with the reduction of chunk m
    /// (`chunks[m]`) of everyone's vector in `dst[m]` (length `chunks[m].1`).
    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter(
        &self,
        _b: &mut Builder,
        _g: &[usize],
        _src: &[Span],
        _dst: &[Span],
        _chunks: &[(usize, usize)],
        _start: &Deps,
        _o: &Options,
    ) -> AlgoResult<()> {
        Err(self.na(Collective::ReduceScatter))
    }

    /// Every member ends with member `root`'s `src` in its `dst` (root is a member index).
    #[allow(clippy::too_many_arguments)]
    fn broadcast(
        &self,
        _b: &mut Builder,
        _g: &[usize],
        _root: usize,
        _src: &[Span],
        _dst: &[Span],
        _start: &Deps,
        _o: &Options,
    ) -> AlgoResult<()> {
        Err(self.na(Collective::Broadcast))
    }

    /// Member `root` ends with the reduction of everyone's `src` in its `dst`.
    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        _b: &mut Builder,
        _g: &[usize],
        _root: usize,
        _src: &[Span],
        _dst: &[Span],
        _start: &Deps,
        _o: &Options,
    ) -> AlgoResult<()> {
        Err(self.na(Collective::Reduce))
    }

    /// Block j (length `count`) of member i's `src` lands as block i of member j's `dst`.
    #[allow(clippy::too_many_arguments)]
    fn all_to_all(
        &self,
        _b: &mut Builder,
        _g: &[usize],
        _src: &[Span],
        _dst: &[Span],
        _count: usize,
        _start: &Deps,
        _o: &Options,
    ) -> AlgoResult<()> {
        Err(self.na(Collective::AllToAll))
    }
}

/// The implementation of each algorithm.
pub fn implementation(algo: Algorithm) -> Option<&'static dyn Collectives> {
    Some(match algo {
        Algorithm::Ring => &ring::Ring,
        Algorithm::BidirRing => &bidir_ring::BidirRing,
        Algorithm::Mesh => &mesh::Mesh,
        Algorithm::Mesh1 => &mesh1::Mesh1,
        Algorithm::Rdh => &rdh::Rdh,
        Algorithm::Rd => &rd::Rd,
        Algorithm::Tree => &tree::Tree,
        Algorithm::DbTree => &dbtree::DbTree,
        Algorithm::Bruck => &bruck::Bruck,
        Algorithm::Pairwise => &pairwise::Pairwise,
        Algorithm::Hier => &hier::Hier,
        Algorithm::Swizzle => &swizzle::Swizzle,
    })
}

/// The collectives an algorithm implements.
pub fn supports(algo: Algorithm, coll: Collective) -> bool {
    // The cost model asks this for every candidate on every call, so the answer is probed once
    // per pair (by building a 2-rank, 1-element schedule) and then read from a table.
    static TABLE: once_cell::sync::Lazy<Vec<(Algorithm, Collective, bool)>> =
        once_cell::sync::Lazy::new(|| {
            Algorithm::ALL
                .iter()
                .flat_map(|a| Collective::ALL.iter().map(move |c| (*a, *c)))
                .map(|(a, c)| (a, c, probe_support(a, c)))
                .collect()
        });
    TABLE.iter().any(|&(a, c, ok)| a == algo && c == coll && ok)
}

fn probe_support(algo: Algorithm, coll: Collective) -> bool {
    build(Problem::new(coll, 2, 1), algo, &Options::default()).is_ok()
}
