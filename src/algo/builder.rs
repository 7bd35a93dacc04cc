//! The schedule builder the algorithms write against: every rank's step list, and the
//! helpers that cut buffers into chunks and slices.
use super::*;

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
