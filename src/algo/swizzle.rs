//! Node-swizzled two-level ReduceScatter and its mirror AllGather (Triton-distributed's
//! inter-node ReduceScatter), over the hosts of the group's members (`Options::hosts`, in order
//! of first appearance; `H[h][k]` the k-th member of host h), with `Options::intra` (any flat
//! algorithm that implements the collective) inside each host.
//!
//! ReduceScatter: the input is split by destination host. At step n = 0..X-1, host i takes the
//! part destined for host d = (i + n + 1) mod X and reduce-scatters it inside the host (intra):
//! member k keeps the host's partial of the chunk of `H[d][k]`, and sends it to `H[d][k]`, the
//! member of the same local index there. The last step (d = i) is the own host: its partial
//! stays in the output. Each member receives X - 1 partials (one per other host, in the order
//! they are sent), accumulating them as they land (receive-reduce), and adds its own host's.
//! At every step each host sends to a different host, so inter-host links carry equal loads,
//! and only 1/Y of the data crosses the network. The intra step of part n+1 follows that of
//! part n on each member (dependencies, no frontiers), so it overlaps part n's network send; the
//! sends of part n+1 follow part n's, keeping the swizzle's order on the wire.
//!
//! AllGather, the mirror: at step n each member sends its chunk to the member of its local index
//! on host (own + n + 1) mod X, which receives it in place; each host all-gathers (intra) its own
//! part first (no network), then each arriving part as soon as its chunks are in.
//!
//! AllReduce: swizzle ReduceScatter into the output, then swizzle AllGather in place (each
//! element is reduced on one member only: bit-identical everywhere).
//!
//! Uneven hosts: where host d has more members than host i, i's members serve `H[d]` in rounds
//! of |H[i]| (member k takes the chunk of `H[d][q|H[i]| + k]` in round q, one intra collective
//! per round); where it has fewer, i's extra members hold empty chunks. A member of a one-member
//! host sends its chunk straight from the input. One host runs the intra algorithm alone.
//! Tmp: ReduceScatter the partials it sends (X-1 chunks when even) plus one accumulator chunk.
#![forbid(unsafe_code)]

use super::hier::{level, rounds};
use super::{
    slices, AlgoResult, Algorithm, Buf, Builder, Collective, Collectives, Deps, Options, Span,
};

pub struct Swizzle;

/// The steps of `rank` from index `from` on that no later step of that range waits for,
/// joined into one (empty when there are none).
fn tips(b: &mut Builder, rank: usize, from: usize) -> Vec<usize> {
    let steps = &b.ranks[rank];
    let mut needed = vec![true; steps.len().saturating_sub(from)];
    for s in &steps[from.min(steps.len())..] {
        for &d in &s.deps {
            if d >= from {
                needed[d - from] = false;
            }
        }
    }
    let t: Vec<usize> = (0..needed.len())
        .filter(|&i| needed[i])
        .map(|i| i + from)
        .collect();
    b.join(rank, &t)
}

/// The steps of `rank` from index `from` on that write memory overlapping `sp`.
fn writers(b: &Builder, rank: usize, from: usize, sp: Span) -> Vec<usize> {
    let steps = &b.ranks[rank];
    (from.min(steps.len())..steps.len())
        .filter(|&i| steps[i].op.writes().is_some_and(|w| w.overlaps(&sp)))
        .collect()
}

impl Swizzle {
    #[allow(clippy::too_many_arguments)]
    fn rs(
        &self,
        b: &mut Builder,
        g: &[usize],
        src: &[Span],
        dst: &[Span],
        chunks: &[(usize, usize)],
        start: &Deps,
        o: &Options,
        coll: Collective,
    ) -> AlgoResult<()> {
        let intra = level("intra", o.intra)?;
        let hs = o.hosts.groups(g);
        let x = hs.len();
        if x == 1 {
            return self.as_own(coll, intra.reduce_scatter(b, g, src, dst, chunks, start, o));
        }
        // Per rank: what its next intra collective waits for (the previous one) and what its
        // next send waits for (the last slice of the previous part's send).
        let mut after: Deps = start.clone();
        let mut sent: Vec<Option<usize>> = vec![None; b.nranks()];
        // Per member: its own host's partial (span and the steps that wrote it).
        let mut own: Vec<(Span, Vec<usize>)> = vec![(Span::new(Buf::Tmp, 0, 0), vec![]); g.len()];
        for n in 0..x {
            for (i, h) in hs.iter().enumerate() {
                let d = (i + n + 1) % x;
                let to = &hs[d];
                for rd in rounds(h.len(), to, h.len(), chunks) {
                    let tgt = rd.tgt;
                    if h.len() == 1 {
                        // No intra step: the partial is the input chunk itself.
                        let (m, e) = (h[0], tgt[0].expect("a one-member host serves all"));
                        let part = src[m].sub(chunks[e].0, chunks[e].1);
                        if d == i {
                            own[m] = (part, vec![]);
                        } else {
                            let mut deps = start[g[m]].clone();
                            deps.extend(sent[g[m]]);
                            for sl in slices(part, o.slice) {
                                sent[g[m]] = Some(b.send(g[m], g[e], sl, &deps));
                            }
                        }
                        continue;
                    }
                    let ((lo, hi), ci) = (rd.cover, rd.rel);
                    let si: Vec<Span> = h.iter().map(|&m| src[m].sub(lo, hi - lo)).collect();
                    let di: Vec<Span> = h
                        .iter()
                        .enumerate()
                        .map(|(k, &m)| match tgt[k] {
                            Some(_) if d == i => dst[m],
                            Some(e) => b.tmp(g[m], chunks[e].1),
                            None => Span::new(Buf::Tmp, 0, 0),
                        })
                        .collect();
                    let from: Vec<usize> = h.iter().map(|&m| b.ranks[g[m]].len()).collect();
                    let gi: Vec<usize> = h.iter().map(|&m| g[m]).collect();
                    let rs = intra.reduce_scatter(b, &gi, &si, &di, &ci, &after, o);
                    self.as_own(coll, rs)?;
                    for (k, &m) in h.iter().enumerate() {
                        let r = g[m];
                        let w = writers(b, r, from[k], di[k]);
                        let t = tips(b, r, from[k]);
                        if !t.is_empty() {
                            after[r] = t;
                        }
                        let Some(e) = tgt[k] else { continue };
                        if d == i {
                            own[m] = (di[k], w);
                            continue;
                        }
                        let mut deps = w;
                        deps.extend(start[r].iter().copied().chain(sent[r]));
                        for sl in slices(di[k], o.slice) {
                            sent[r] = Some(b.send(r, g[e], sl, &deps));
                        }
                    }
                }
            }
        }
        // Each member accumulates the other hosts' partials of its chunk in the order they are
        // sent (host d-1 first), then adds its own host's.
        for (d, h) in hs.iter().enumerate() {
            for (j, &e) in h.iter().enumerate() {
                let r = g[e];
                let acc = b.tmp(r, chunks[e].1);
                let mut last: Vec<Option<usize>> = Vec::new();
                for n in 0..x - 1 {
                    let from = &hs[(d + x - 1 - n) % x];
                    let peer = g[from[j % from.len()]];
                    let sl = slices(acc, o.slice);
                    last = sl
                        .iter()
                        .enumerate()
                        .map(|(t, &a)| {
                            let mut deps = start[r].clone();
                            deps.extend(last.get(t).copied().flatten());
                            Some(if n == 0 {
                                b.recv(r, peer, a, &deps)
                            } else {
                                b.recv_reduce(r, peer, a, a, &deps)
                            })
                        })
                        .collect();
                }
                let (os, ow) = own[e].clone();
                let parts = slices(acc, o.slice)
                    .into_iter()
                    .zip(slices(os, o.slice))
                    .zip(slices(dst[e], o.slice));
                for (t, ((a, ol), dl)) in parts.enumerate() {
                    let mut deps = ow.clone();
                    deps.extend(start[r].iter().copied());
                    deps.extend(last.get(t).copied().flatten());
                    b.reduce(r, a, ol, dl, &deps);
                }
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn ag(
        &self,
        b: &mut Builder,
        g: &[usize],
        src: &[Span],
        dst: &[Span],
        chunks: &[(usize, usize)],
        start: &Deps,
        o: &Options,
        coll: Collective,
    ) -> AlgoResult<()> {
        let intra = level("intra", o.intra)?;
        let hs = o.hosts.groups(g);
        let x = hs.len();
        if x == 1 {
            return self.as_own(coll, intra.all_gather(b, g, src, dst, chunks, start, o));
        }
        // Network first: at step n each member sends its chunk to the member of its local
        // index (modulo the size) on host (own + n + 1) mod X, part n+1 after part n.
        // got[t]: (member whose chunk, receive step) of what member t received.
        let mut got: Vec<Vec<(usize, usize)>> = vec![Vec::new(); g.len()];
        for (d, h) in hs.iter().enumerate() {
            for (j, &e) in h.iter().enumerate() {
                let r = g[e];
                let mut prev: Option<usize> = None;
                for n in 0..x - 1 {
                    let to = &hs[(d + n + 1) % x];
                    let t = to[j % to.len()];
                    let mut deps = start[r].clone();
                    deps.extend(prev);
                    let into = dst[t].sub(chunks[e].0, chunks[e].1);
                    for (sl, rl) in slices(src[e], o.slice)
                        .into_iter()
                        .zip(slices(into, o.slice))
                    {
                        prev = Some(b.send(r, g[t], sl, &deps));
                        got[t].push((e, b.recv(g[t], r, rl, &start[g[t]])));
                    }
                }
            }
        }
        // Then per host its own part, then each other host's in arrival order (d-1 first).
        let mut after: Deps = start.clone();
        for (i, h) in hs.iter().enumerate() {
            for n in 0..x {
                let d = (i + x - n) % x;
                let from = &hs[d];
                for rd in rounds(h.len(), from, h.len(), chunks) {
                    let (tgt, (lo, hi), ci) = (rd.tgt, rd.cover, rd.rel);
                    let di: Vec<Span> = h.iter().map(|&m| dst[m].sub(lo, hi - lo)).collect();
                    let mut deps = after.clone();
                    let si: Vec<Span> = (0..h.len())
                        .map(|k| match tgt[k] {
                            None => di[k].sub(0, 0),
                            Some(_) if d == i => src[h[k]],
                            Some(e) => {
                                // The received chunk, in place.
                                let recvs = got[h[k]].iter().filter(|x| x.0 == e);
                                deps[g[h[k]]].extend(recvs.map(|x| x.1));
                                di[k].sub(ci[k].0, ci[k].1)
                            }
                        })
                        .collect();
                    let from_idx: Vec<usize> = h.iter().map(|&m| b.ranks[g[m]].len()).collect();
                    let gi: Vec<usize> = h.iter().map(|&m| g[m]).collect();
                    let ag = intra.all_gather(b, &gi, &si, &di, &ci, &deps, o);
                    self.as_own(coll, ag)?;
                    for (k, &m) in h.iter().enumerate() {
                        let r = g[m];
                        let t = tips(b, r, from_idx[k]);
                        if !t.is_empty() {
                            after[r] = t;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

impl Collectives for Swizzle {
    fn algorithm(&self) -> Algorithm {
        Algorithm::Swizzle
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
        self.rs(b, g, src, dst, chunks, start, o, Collective::ReduceScatter)
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
        self.ag(b, g, src, dst, chunks, start, o, Collective::AllGather)
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
        let c = Collective::AllReduce;
        let hs = o.hosts.groups(g);
        if hs.len() == 1 {
            let intra = level("intra", o.intra)?;
            return self.as_own(c, intra.all_reduce(b, g, src, dst, start, o));
        }
        // Chunks in host order, so that each host's part is contiguous.
        let order: Vec<usize> = hs.concat();
        let ch = super::chunks(src[0].len, g.len());
        let mut chunks = vec![(0, 0); g.len()];
        for (p, &m) in order.iter().enumerate() {
            chunks[m] = ch[p];
        }
        let mine: Vec<Span> = (0..g.len())
            .map(|m| dst[m].sub(chunks[m].0, chunks[m].1))
            .collect();
        self.rs(b, g, src, &mine, &chunks, start, o, c)?;
        let mid = b.frontiers();
        self.ag(b, g, &mine, dst, &chunks, &mid, o, c)
    }
}
