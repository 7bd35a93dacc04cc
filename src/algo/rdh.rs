//! RDH: recursive-halving ReduceScatter, recursive-doubling AllGather and Rabenseifner AllReduce
//! (the two in a row) for any member count. Halving step s pairs member i with i XOR P/2^(s+1):
//! each sends the half of its chunk range that the peer keeps and reduces the other half; doubling
//! pairs i with i XOR 2^s and sends all it has. Non-powers of two (Thakur et al.): with
//! P = 2^floor(log2 N), r = N - P, member 2v (v < r) first hands its data to 2v+1; the P survivors
//! run on virtual chunks (chunks 2v and 2v+1 together: ownership keeps problem order); then 2v+1
//! hands 2v its result. AllReduce cuts its buffer into P chunks and reduces each element on one
//! member only (bit-identical everywhere). Slices are cut on a grid of `slice` elements and each
//! step waits only for the steps that touched its elements, so slices pipeline across steps.
//! Tmp: AllReduce and AllGather none; ReduceScatter half a vector (a whole one where a fold lands).
#![forbid(unsafe_code)]

use super::{AlgoResult, Algorithm, Buf, Builder, Collectives, Deps, Op, Options, Span};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

pub struct Rdh;

/// The last writer of a range of one rank's memory, and its readers since.
#[derive(Clone, Debug)]
struct Seg {
    end: usize,
    writer: Option<usize>,
    readers: Vec<usize>,
}

/// Per-rank memory access history, for exact dependencies (read-after-write, write-after-read,
/// write-after-write) between the steps one collective emits. `In` is never written: untracked.
#[derive(Clone, Debug, Default)]
struct Tracker {
    segs: BTreeMap<(Buf, usize), Seg>,
    /// Scratch of `record`, kept to save an allocation per step.
    gaps: Vec<(usize, usize)>,
}

impl Tracker {
    /// The segment that starts before `at` and extends past it, if any.
    fn covering(&self, buf: Buf, at: usize) -> Option<usize> {
        self.segs
            .range(..(buf, at))
            .next_back()
            .and_then(|(&(b, off), s)| (b == buf && s.end > at).then_some(off))
    }

    fn split(&mut self, buf: Buf, at: usize) {
        if let Some(off) = self.covering(buf, at) {
            let s = self.segs.get_mut(&(buf, off)).expect("segment");
            let tail = Seg {
                end: s.end,
                writer: s.writer,
                readers: s.readers.clone(),
            };
            s.end = at;
            self.segs.insert((buf, at), tail);
        }
    }

    fn deps(&self, sp: Span, write: bool, out: &mut Vec<usize>) {
        if sp.len == 0 || sp.buf == Buf::In {
            return;
        }
        let mut add = |s: &Seg| {
            out.extend(s.writer);
            if write {
                out.extend_from_slice(&s.readers);
            }
        };
        if let Some(off) = self.covering(sp.buf, sp.off) {
            add(&self.segs[&(sp.buf, off)]);
        }
        for s in self
            .segs
            .range((sp.buf, sp.off)..(sp.buf, sp.end()))
            .map(|x| x.1)
        {
            add(s);
        }
    }

    fn record(&mut self, sp: Span, id: usize, write: bool) {
        if sp.len == 0 || sp.buf == Buf::In {
            return;
        }
        let (buf, end) = (sp.buf, sp.end());
        self.split(buf, sp.off);
        self.split(buf, end);
        if write {
            while let Some(k) = self
                .segs
                .range((buf, sp.off)..(buf, end))
                .next()
                .map(|x| *x.0)
            {
                self.segs.remove(&k);
            }
            let seg = Seg {
                end,
                writer: Some(id),
                readers: Vec::new(),
            };
            self.segs.insert((buf, sp.off), seg);
            return;
        }
        let mut cur = sp.off;
        let mut gaps = std::mem::take(&mut self.gaps);
        for (&(_, off), s) in self.segs.range_mut((buf, sp.off)..(buf, end)) {
            if off > cur {
                gaps.push((cur, off));
            }
            s.readers.push(id);
            cur = s.end;
        }
        if cur < end {
            gaps.push((cur, end));
        }
        for (a, e) in gaps.drain(..) {
            let seg = Seg {
                end: e,
                writer: None,
                readers: vec![id],
            };
            self.segs.insert((buf, a), seg);
        }
        self.gaps = gaps;
    }
}

/// Emits steps over a group with exact dependencies: each step waits for the phase's `start`
/// frontier of its rank, and for the earlier steps of this emitter that touched its memory.
pub(crate) struct Sched<'a> {
    pub b: &'a mut Builder,
    start: &'a Deps,
    /// The trackers of the ranks this emitter has touched: a two-level plan runs one emitter
    /// per group of a few ranks, many times, so a tracker for every rank of the communicator
    /// per emitter would cost the communicator's size each time.
    tr: FxHashMap<usize, Tracker>,
    /// Scratch of `op`, kept to save an allocation per step.
    deps: Vec<usize>,
}

impl<'a> Sched<'a> {
    pub fn new(b: &'a mut Builder, start: &'a Deps) -> Sched<'a> {
        Sched {
            b,
            start,
            tr: FxHashMap::default(),
            deps: Vec::new(),
        }
    }

    /// Append `op` to `rank`'s list after its hazards and `extra`; returns its index.
    pub fn op(&mut self, rank: usize, op: Op, extra: &[usize]) -> usize {
        let (reads, write) = (op.read_spans(), op.writes());
        let mut deps = std::mem::take(&mut self.deps);
        deps.clear();
        deps.extend_from_slice(&self.start[rank]);
        deps.extend_from_slice(extra);
        let t = self.tr.entry(rank).or_default();
        for r in reads.iter().flatten() {
            t.deps(*r, false, &mut deps);
        }
        if let Some(w) = write {
            t.deps(w, true, &mut deps);
        }
        let id = self.b.push(rank, op, &deps);
        self.deps = deps;
        for r in reads.into_iter().flatten() {
            t.record(r, id, false);
        }
        if let Some(w) = write {
            t.record(w, id, true);
        }
        id
    }

    /// Empty messages are skipped (both ends know every length).
    pub fn send(&mut self, rank: usize, peer: usize, src: Span) -> Option<usize> {
        (src.len > 0).then(|| self.op(rank, Op::Send { peer, src }, &[]))
    }

    pub fn recv(&mut self, rank: usize, peer: usize, dst: Span) -> Option<usize> {
        (dst.len > 0).then(|| self.op(rank, Op::Recv { peer, dst }, &[]))
    }

    pub fn recv_reduce(&mut self, rank: usize, peer: usize, src: Span, dst: Span) -> Option<usize> {
        (dst.len > 0).then(|| self.op(rank, Op::RecvReduce { peer, src, dst }, &[]))
    }

    /// `dst = src`; nothing when they are the same span or empty.
    pub fn copy(&mut self, rank: usize, src: Span, dst: Span) -> Option<usize> {
        (src != dst && src.len > 0).then(|| self.op(rank, Op::Copy { src, dst }, &[]))
    }

    pub fn reduce(&mut self, rank: usize, a: Span, b: Span, dst: Span) -> Option<usize> {
        (dst.len > 0).then(|| self.op(rank, Op::Reduce { a, b, dst }, &[]))
    }
}

/// Pieces `(off, len)` of `[lo, hi)` cut at the multiples of `slice` (no cut when 0), so that
/// the pieces of a sub-range nest in those of the range. None when the range is empty.
pub(crate) fn grid(lo: usize, hi: usize, slice: usize) -> Vec<(usize, usize)> {
    let mut v = Vec::new();
    let mut a = lo;
    while a < hi {
        let e = match a.checked_div(slice) {
            Some(q) => ((q + 1) * slice).min(hi),
            None => hi,
        };
        v.push((a, e - a));
        a = e;
    }
    v
}

/// Thakur's folding of `n >= 1` members: (P, r) with P = 2^floor(log2 n) and r = n - P.
pub(crate) fn fold(n: usize) -> (usize, usize) {
    let p = 1usize << (usize::BITS - 1 - n.leading_zeros());
    (p, n - p)
}

/// The member that plays virtual member `v` (the odd one of a folded pair).
pub(crate) fn real(v: usize, r: usize) -> usize {
    if v < r {
        2 * v + 1
    } else {
        v + r
    }
}

/// The vector as `units` (`(off, len)` in vector coordinates); virtual chunk v is units
/// `vstart[v]..vstart[v+1]`.
struct Layout {
    units: Vec<(usize, usize)>,
    vstart: Vec<usize>,
}

impl Layout {
    /// Coalesced non-empty runs `(lo, hi)` of units `ua..ub`.
    fn runs(&self, ua: usize, ub: usize) -> Vec<(usize, usize)> {
        let mut v: Vec<(usize, usize)> = Vec::new();
        for &(off, len) in &self.units[ua..ub] {
            if len == 0 {
                continue;
            }
            match v.last_mut() {
                Some(last) if last.1 == off => last.1 = off + len,
                _ => v.push((off, off + len)),
            }
        }
        v
    }

    /// Message pieces of virtual chunks `va..vb`; `per_unit` cuts at every unit boundary too.
    fn pieces(&self, va: usize, vb: usize, slice: usize, per_unit: bool) -> Vec<(usize, usize)> {
        let (ua, ub) = (self.vstart[va], self.vstart[vb]);
        let runs = if per_unit {
            self.units[ua..ub]
                .iter()
                .map(|&(o, l)| (o, o + l))
                .collect()
        } else {
            self.runs(ua, ub)
        };
        runs.into_iter()
            .flat_map(|(lo, hi)| grid(lo, hi, slice))
            .collect()
    }

    /// The unit of virtual chunk `v` that holds vector offset `off`.
    fn unit_of(&self, v: usize, off: usize) -> usize {
        (self.vstart[v]..self.vstart[v + 1])
            .find(|&u| off >= self.units[u].0 && off < self.units[u].0 + self.units[u].1)
            .expect("offset in a unit")
    }
}

/// Where a member keeps vector elements `[base, base + sp.len)`.
#[derive(Clone, Copy, Debug)]
struct Area {
    sp: Span,
    base: usize,
}

impl Area {
    fn full(sp: Span) -> Area {
        Area { sp, base: 0 }
    }

    fn at(&self, off: usize, len: usize) -> Span {
        self.sp.sub(off - self.base, len)
    }
}

/// Recursive halving among the P = `who.len()` virtual members. Virtual member v reads its
/// contributions from `from[v]`, accumulates in `work[v]`, and at the last step stores unit u
/// of its chunk in `fin(v, u)` when that is given (else in `work[v]`).
fn halving(
    s: &mut Sched,
    lay: &Layout,
    who: &[usize],
    from: &[Area],
    work: &[Area],
    fin: &dyn Fn(usize, usize) -> Option<Span>,
    slice: usize,
) {
    let p = who.len();
    let steps = p.trailing_zeros() as usize;
    for st in 0..steps {
        let bit = p >> (st + 1);
        let last = st + 1 == steps;
        for v in 0..p {
            let w = v ^ bit;
            let lo = v & !(2 * bit - 1);
            let (keep, give) = if v & bit == 0 {
                (lo, lo + bit)
            } else {
                (lo + bit, lo)
            };
            let data = if st == 0 { from[v] } else { work[v] };
            for (o, l) in lay.pieces(give, give + bit, slice, last) {
                s.send(who[v], who[w], data.at(o, l));
            }
            for (o, l) in lay.pieces(keep, keep + bit, slice, last) {
                let dst = if last {
                    let u = lay.unit_of(v, o);
                    fin(v, u).map(|d| d.sub(o - lay.units[u].0, l))
                } else {
                    None
                };
                let dst = dst.unwrap_or_else(|| work[v].at(o, l));
                s.recv_reduce(who[v], who[w], data.at(o, l), dst);
            }
        }
    }
}

/// Recursive doubling among the P virtual members over `data[v]` (vector coordinates); at the
/// first step v may send its own chunk from `first[v]` instead.
fn doubling(
    s: &mut Sched,
    lay: &Layout,
    who: &[usize],
    data: &[Area],
    first: &[Option<Area>],
    slice: usize,
) {
    let p = who.len();
    let steps = p.trailing_zeros() as usize;
    for st in 0..steps {
        let bit = 1usize << st;
        for v in 0..p {
            let w = v ^ bit;
            let (mine, theirs) = (v & !(bit - 1), w & !(bit - 1));
            let from = match first[v] {
                Some(a) if st == 0 => a,
                _ => data[v],
            };
            for (o, l) in lay.pieces(mine, mine + bit, slice, false) {
                s.send(who[v], who[w], from.at(o, l));
            }
            for (o, l) in lay.pieces(theirs, theirs + bit, slice, false) {
                s.recv(who[v], who[w], data[v].at(o, l));
            }
        }
    }
}

/// The layout of a ReduceScatter / AllGather over `n` members: one unit per member, virtual
/// chunk v = the chunks of the members it stands for.
fn member_layout(chunks: &[(usize, usize)], n: usize) -> Layout {
    let (p, r) = fold(n);
    Layout {
        units: chunks.to_vec(),
        vstart: (0..=p).map(|v| if v < r { 2 * v } else { v + r }).collect(),
    }
}

/// Recursive-halving ReduceScatter over group `g` (any size).
pub(crate) fn reduce_scatter(
    b: &mut Builder,
    g: &[usize],
    src: &[Span],
    dst: &[Span],
    chunks: &[(usize, usize)],
    start: &Deps,
    o: &Options,
) {
    let n = g.len();
    let mut s = Sched::new(b, start);
    if n == 1 {
        s.copy(g[0], src[0].sub(chunks[0].0, chunks[0].1), dst[0]);
        return;
    }
    let (p, r) = fold(n);
    let lay = member_layout(chunks, n);
    let len = src[0].len;
    let all = lay.runs(0, n);
    let who: Vec<usize> = (0..p).map(|v| g[real(v, r)]).collect();
    let (mut from, mut work) = (Vec::new(), Vec::new());
    for v in 0..p {
        let m = real(v, r);
        if v < r {
            // Fold: 2v's whole vector is reduced into 2v+1's scratch, which then works in place.
            let e = m - 1;
            let f = s.b.tmp(g[m], len);
            for &(lo, hi) in &all {
                for (o, l) in grid(lo, hi, o.slice) {
                    s.send(g[e], g[m], src[e].sub(o, l));
                    s.recv_reduce(g[m], g[e], src[m].sub(o, l), f.sub(o, l));
                }
            }
            from.push(Area::full(f));
            work.push(Area::full(f));
            continue;
        }
        from.push(Area::full(src[m]));
        // The accumulator covers the half kept at the first step (the last step writes `dst`).
        let half = if v & (p >> 1) == 0 { 0 } else { p >> 1 };
        let kept = lay.runs(lay.vstart[half], lay.vstart[half + (p >> 1)]);
        let lo = kept.iter().map(|x| x.0).min().unwrap_or(0);
        let hi = kept.iter().map(|x| x.1).max().unwrap_or(0);
        let sp = if p > 2 && hi > lo {
            s.b.tmp(g[m], hi - lo)
        } else {
            Span::new(Buf::Tmp, 0, 0)
        };
        work.push(Area { sp, base: lo });
    }
    let fin = |v: usize, u: usize| (u == real(v, r)).then_some(dst[u]);
    halving(&mut s, &lay, &who, &from, &work, &fin, o.slice);
    // Unfold: 2v+1 hands 2v its chunk.
    for (v, acc) in work.iter().enumerate().take(r) {
        let (m, e) = (2 * v + 1, 2 * v);
        let (off, l) = chunks[e];
        for (po, pl) in grid(off, off + l, o.slice) {
            s.send(g[m], g[e], acc.at(po, pl));
            s.recv(g[e], g[m], dst[e].sub(po - off, pl));
        }
    }
}

/// Recursive-doubling AllGather over group `g` (any size).
pub(crate) fn all_gather(
    b: &mut Builder,
    g: &[usize],
    src: &[Span],
    dst: &[Span],
    chunks: &[(usize, usize)],
    start: &Deps,
    o: &Options,
) {
    let n = g.len();
    let mut s = Sched::new(b, start);
    for m in 0..n {
        s.copy(g[m], src[m], dst[m].sub(chunks[m].0, chunks[m].1));
    }
    if n == 1 {
        return;
    }
    let (p, r) = fold(n);
    let lay = member_layout(chunks, n);
    // Fold: 2v hands its chunk to 2v+1.
    for v in 0..r {
        let (m, e) = (2 * v + 1, 2 * v);
        let (off, l) = chunks[e];
        for (po, pl) in grid(off, off + l, o.slice) {
            s.send(g[e], g[m], src[e].sub(po - off, pl));
            s.recv(g[m], g[e], dst[m].sub(po, pl));
        }
    }
    let who: Vec<usize> = (0..p).map(|v| g[real(v, r)]).collect();
    let data: Vec<Area> = (0..p).map(|v| Area::full(dst[real(v, r)])).collect();
    let first: Vec<Option<Area>> = (0..p)
        .map(|v| {
            let m = real(v, r);
            (v >= r).then_some(Area {
                sp: src[m],
                base: chunks[m].0,
            })
        })
        .collect();
    doubling(&mut s, &lay, &who, &data, &first, o.slice);
    // Unfold: 2v+1 hands 2v every chunk but its own.
    for v in 0..r {
        let (m, e) = (2 * v + 1, 2 * v);
        let mut runs = lay.runs(0, e);
        runs.extend(lay.runs(e + 1, n));
        for (lo, hi) in runs {
            for (po, pl) in grid(lo, hi, o.slice) {
                s.send(g[m], g[e], dst[m].sub(po, pl));
                s.recv(g[e], g[m], dst[e].sub(po, pl));
            }
        }
    }
}

/// Rabenseifner AllReduce over group `g` (any size).
pub(crate) fn all_reduce(
    b: &mut Builder,
    g: &[usize],
    src: &[Span],
    dst: &[Span],
    start: &Deps,
    o: &Options,
) {
    let n = g.len();
    let mut s = Sched::new(b, start);
    if n == 1 {
        s.copy(g[0], src[0], dst[0]);
        return;
    }
    let (p, r) = fold(n);
    let len = src[0].len;
    let lay = Layout {
        units: super::chunks(len, p),
        vstart: (0..=p).collect(),
    };
    // Fold: 2v's vector is reduced into 2v+1's output, where 2v+1 then works.
    for v in 0..r {
        let (m, e) = (2 * v + 1, 2 * v);
        for (po, pl) in grid(0, len, o.slice) {
            s.send(g[e], g[m], src[e].sub(po, pl));
            s.recv_reduce(g[m], g[e], src[m].sub(po, pl), dst[m].sub(po, pl));
        }
    }
    let who: Vec<usize> = (0..p).map(|v| g[real(v, r)]).collect();
    let work: Vec<Area> = (0..p).map(|v| Area::full(dst[real(v, r)])).collect();
    let from: Vec<Area> = (0..p)
        .map(|v| Area::full(if v < r { dst } else { src }[real(v, r)]))
        .collect();
    halving(&mut s, &lay, &who, &from, &work, &|_, _| None, o.slice);
    doubling(&mut s, &lay, &who, &work, &vec![None; p], o.slice);
    // Unfold: 2v+1 hands 2v the result.
    for v in 0..r {
        let (m, e) = (2 * v + 1, 2 * v);
        for (po, pl) in grid(0, len, o.slice) {
            s.send(g[m], g[e], dst[m].sub(po, pl));
            s.recv(g[e], g[m], dst[e].sub(po, pl));
        }
    }
}

impl Collectives for Rdh {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Rdh
    }

    fn all_reduce(
        &self,
        b: &mut Builder,
        g: &[usize],
        src: &[Span],
        dst: &[Span],
        start: &Deps,
        o: &Options,
    ) -> AlgoResult<()> {
        all_reduce(b, g, src, dst, start, o);
        Ok(())
    }

    fn all_gather(
        &self,
        b: &mut Builder,
        g: &[usize],
        src: &[Span],
        dst: &[Span],
        chunks: &[(usize, usize)],
        start: &Deps,
        o: &Options,
    ) -> AlgoResult<()> {
        all_gather(b, g, src, dst, chunks, start, o);
        Ok(())
    }

    fn reduce_scatter(
        &self,
        b: &mut Builder,
        g: &[usize],
        src: &[Span],
        dst: &[Span],
        chunks: &[(usize, usize)],
        start: &Deps,
        o: &Options,
    ) -> AlgoResult<()> {
        reduce_scatter(b, g, src, dst, chunks, start, o);
        Ok(())
    }
}
